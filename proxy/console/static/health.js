// Health: readiness as /readyz decides it, the store (what its reads and writes found), upstream
// errors by kind.
import { getJson } from "./api.js";
import { fmtInt, h } from "./dom.js";

const KINDS = ["refused", "timeout", "reset", "midstream"];

export async function healthPage(view) {
  document.title = "Health · context-proxy console";
  view.append(h("h1", {}, "Health"));
  const data = await getJson("/console/api/health");
  const kinds = [...new Set([...KINDS, ...Object.keys(data.upstream_errors || {})])];
  view.append(
    h("section", { class: "card", "aria-label": "Readiness" },
      h("h2", {}, "Readiness"),
      h("p", { class: "figure " + (data.ready ? "ok" : "bad"), "data-figure": "ready" }, data.ready ? "ready" : "not ready"),
      data.problems.length ? h("ul", {}, data.problems.map((x) => h("li", {}, x))) : null),
    h("section", { class: "card", "aria-label": "Store" },
      h("h2", {}, "Store"),
      h("p", { class: "figure " + (data.store === "ok" ? "ok" : "bad"), "data-figure": "store" }, data.store),
      h("ul", { class: "detail" }, Object.entries(data.store_operations || {}).map(([kind, op]) =>
        h("li", { "data-store": kind },
          op.ok ? `${kind}: working` : `${kind}: failing (${fmtInt(op.failures)} failed): ${op.last_failure || "unknown"}`)))),
    h("table", {},
      h("caption", {}, "Upstream errors by kind (this replica, since it started)"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Kind"), h("th", { scope: "col" }, "Errors"))),
      h("tbody", {}, kinds.map((k) => h("tr", { "data-kind": k },
        h("th", { scope: "row" }, k), h("td", { class: "num" }, fmtInt((data.upstream_errors || {})[k] || 0)))))),
    h("p", { class: "detail" }, "Checked at " + data.checked_at),
  );
}
