// Limits: the tenant's budgets and rate limits — each limit's allowance, what the current window
// used and what remains, for the tenant and each proxy key that used its own (GET /admin/v1/quota).
import { admin } from "./api.js";
import { fmtInt, fmtTime, fmtUsd, h, message, table } from "./dom.js";

const NAMES = {
  requests: "Requests per minute",
  input_tokens: "Input tokens per minute",
  output_tokens: "Output tokens per minute",
  spend_usd: "Budget (USD)",
};

function amount(metric, value) {
  return metric === "spend_usd" ? fmtUsd(value) : fmtInt(value);
}

function scopeName(scope) {
  return scope === "tenant" ? "Tenant" : "Key " + scope.slice("key:".length);
}

export async function quotaPage(view) {
  document.title = "Limits · context-proxy console";
  view.append(h("h1", {}, "Limits"));
  const data = await admin("/quota");
  if (!data.limits.length) {
    view.append(message("status", "No budget or rate limit applies to this tenant."));
    return;
  }
  const rows = data.limits.map((e) => {
    const name = `${scopeName(e.scope)}: ${NAMES[e.metric] || e.metric}`;
    const period = e.metric === "spend_usd" ? ` per ${e.period}` : "";
    return h("tr", { "data-scope": e.scope, "data-metric": e.metric },
      h("th", { scope: "row" }, name + period),
      h("td", { class: "num", "data-value": e.limit }, amount(e.metric, e.limit)),
      h("td", { class: "num", "data-value": e.used }, amount(e.metric, e.used)),
      h("td", { class: "num", "data-value": e.remaining }, amount(e.metric, e.remaining)),
      h("td", {}, h("meter", { min: 0, max: e.limit, value: Math.min(e.used, e.limit), "aria-label": name + " used" })),
      h("td", {}, fmtTime(e.resets_at)));
  });
  view.append(
    table("Budgets and rate limits", ["Limit", "Allowance", "Used", "Remaining", "Share used", "Resets at"], rows),
    h("p", { class: "detail" },
      "Counted across every replica through the store. Spend is priced as the usage ledger prices it. As of " +
      fmtTime(data.at) + "."),
  );
}
