// Sessions: the tenant's sessions with usage figures; filter by model, status, time; sort.
import { admin, whoami } from "./api.js";
import { fmtInt, fmtMoney, fmtPct, fmtTime, h, link, message } from "./dom.js";
import { RANGES, window_ } from "./ranges.js";

const PAGE = 50;
const SORTS = [["recent", "Most recent"], ["cost", "Highest cost"], ["savings", "Highest savings"]];
const STATUSES = [["", "Any status"], ["ok", "Without errors"], ["error", "With errors"]];

// A session's cost: the ledger's totals carry the split ({input, ..., total}).
const costOf = (s) => (s.cost_usd && typeof s.cost_usd === "object" ? s.cost_usd.total : s.cost_usd);

export const sessionHref = (id) => "/console/sessions/" + encodeURIComponent(id);

function select(id, label, options, current) {
  return [
    h("label", { for: id }, label), " ",
    h("select", { id, name: id }, options.map(([v, text]) => h("option", { value: v, selected: v === current }, text))),
  ];
}

export async function sessionsPage(view, navigate) {
  document.title = "Sessions · context-proxy console";
  const p = new URLSearchParams(location.search);
  const state = {
    model: p.get("model") || "",
    status: ["ok", "error"].includes(p.get("status")) ? p.get("status") : "",
    range: RANGES.some((r) => r.key === p.get("range")) || p.get("range") === "all" ? p.get("range") : "all",
    sort: SORTS.some(([k]) => k === p.get("sort")) ? p.get("sort") : "recent",
    offset: Math.max(0, parseInt(p.get("offset") || "0", 10) || 0),
  };
  view.append(h("h1", {}, "Sessions"));
  const form = h("form", { class: "controls", role: "search", "aria-label": "Filter sessions" },
    h("label", { for: "model" }, "Model"), " ",
    h("input", { id: "model", name: "model", type: "text", value: state.model, placeholder: "any model" }), " ",
    select("status", "Status", STATUSES, state.status), " ",
    select("time", "Time", [["all", "All time"], ...RANGES.map((r) => [r.key, r.label])], state.range), " ",
    select("sort", "Sort by", SORTS, state.sort), " ",
    h("button", { type: "submit" }, "Apply"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const q = new URLSearchParams();
    const f = new FormData(form);
    if (f.get("model")) q.set("model", f.get("model"));
    if (f.get("status")) q.set("status", f.get("status"));
    if (f.get("time") !== "all") q.set("range", f.get("time"));
    if (f.get("sort") !== "recent") q.set("sort", f.get("sort"));
    navigate("/console/sessions" + (q.toString() ? "?" + q : ""));
  });
  view.append(form);

  const params = { model: state.model, status: state.status, sort: state.sort, limit: PAGE, offset: state.offset };
  if (state.range !== "all") {
    [params.since, params.until] = window_(RANGES.find((r) => r.key === state.range));
  }
  if (!(await whoami()).ledger) return plainList(view);
  const data = await admin("/usage/sessions", params);
  const rows = data.sessions.map((s) =>
    h("tr", { "data-session": s.session },
      h("th", { scope: "row" }, link(sessionHref(s.session), s.session)),
      h("td", {}, fmtTime(s.last_at)),
      h("td", {}, (s.models || []).join(", ")),
      h("td", { class: "num" }, fmtInt(s.calls)),
      h("td", { class: "num" }, fmtInt(s.errors)),
      h("td", { class: "num" }, fmtInt(s.compaction_events)),
      h("td", { class: "num" }, fmtInt(s.summary_failures)),
      h("td", { class: "num" }, fmtInt(s.total_input_tokens)),
      h("td", { class: "num" }, fmtPct(s.cache_hit_ratio)),
      h("td", { class: "num" }, fmtInt(s.tokens_saved)),
      h("td", { class: "num", "data-usd": costOf(s), title: s.unpriced_note || null }, fmtMoney(s, costOf(s))),
      h("td", { class: "num savings", "data-savings-usd": s.savings_usd, title: s.unpriced_note || null }, fmtMoney(s, s.savings_usd))));
  view.append(
    h("p", { class: "detail", role: "status" }, `${fmtInt(data.total)} sessions`),
    h("table", {},
      h("caption", {}, "Sessions"),
      h("thead", {}, h("tr", {}, ["Session", "Last activity", "Models", "Calls", "Errors", "Compactions",
        "Summary failures", "Input tokens", "Cache hit", "Tokens saved", "Cost", "Savings"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
  if (!rows.length) view.append(message("notice", "No session matches."));
  // a model without a price: the API's own words, once each
  for (const note of new Set(data.sessions.map((x) => x.unpriced_note).filter(Boolean))) {
    view.append(message("notice", note));
  }
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });
  const at = (offset) => {
    const q = new URLSearchParams(location.search);
    if (offset) q.set("offset", String(offset)); else q.delete("offset");
    return "/console/sessions" + (q.toString() ? "?" + q : "");
  };
  if (state.offset > 0) pager.append(link(at(Math.max(0, state.offset - PAGE)), "Previous page"), " ");
  if (state.offset + PAGE < data.total) pager.append(link(at(state.offset + PAGE), "Next page"));
  view.append(pager);
}

async function plainList(view) {
  view.append(message("notice",
    "The usage ledger is not available on this proxy (no /admin/v1/usage): sessions are listed without figures, filters and sorting."));
  const data = await admin("/sessions");
  view.append(h("table", {},
    h("caption", {}, "Sessions"),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Session"))),
    h("tbody", {}, data.sessions.map((s) => h("tr", { "data-session": s }, h("th", { scope: "row" }, link(sessionHref(s), s)))))));
}
