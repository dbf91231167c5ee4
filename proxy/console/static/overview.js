// Overview: the tenant's usage over a chosen time range (the usage ledger's summary).
import { admin, whoami } from "./api.js";
import { chart } from "./chart.js";
import { fmtInt, fmtPct, fmtUsd, h, message } from "./dom.js";
import { RANGES, bucketLabel, rangeOf, window_ } from "./ranges.js";

export function rangePicker(current, onChange, label = "Time range") {
  const select = h("select", { id: "range", name: "range" },
    RANGES.map((r) => h("option", { value: r.key, selected: r.key === current }, r.label)));
  select.addEventListener("change", () => onChange(select.value));
  return h("p", { class: "controls" }, h("label", { for: "range" }, label), " ", select);
}

export function ledgerMissing(view) {
  view.append(message("notice",
    "The usage ledger is not available on this proxy (no /admin/v1/usage): usage figures cannot be shown."));
}

function card(name, figure, value, detail) {
  return h("section", { class: "card", "aria-label": name },
    h("h2", {}, name),
    h("p", { class: "figure", "data-figure": figure }, value),
    detail ? h("p", { class: "detail" }, detail) : null);
}

export async function overviewPage(view, navigate) {
  document.title = "Overview · context-proxy console";
  const params = new URLSearchParams(location.search);
  const range = rangeOf(params.get("range"));
  view.append(h("h1", {}, "Overview"));
  view.append(rangePicker(range.key, (key) => navigate("/console/?range=" + encodeURIComponent(key))));
  const [since, until] = window_(range);
  if (!(await whoami()).ledger) return ledgerMissing(view);
  const data = await admin("/usage/summary", { since, until, bucket: range.bucket });
  const t = data.totals;
  const cost = t.cost_usd || {};
  view.append(
    h("p", { class: "detail" }, `From ${data.since} to ${data.until}`),
    h("div", { class: "cards" },
      card("Requests", "client_calls", fmtInt(t.client_calls),
        `${fmtInt(t.calls)} upstream calls: ${fmtInt(t.summary_calls)} summary, ${fmtInt(t.retrieval_calls)} retrieval`),
      card("Tokens saved", "tokens_saved", fmtInt(t.tokens_saved),
        `${fmtInt(t.tokens_before)} before compaction, ${fmtInt(t.tokens_after)} after`),
      card("Cache hit ratio", "cache_hit_ratio", fmtPct(t.cache_hit_ratio),
        `${fmtInt(t.cache_read_input_tokens)} of ${fmtInt(t.total_input_tokens)} input tokens read from the cache`),
      card("Cost", "cost_total", fmtUsd(cost.total),
        `input ${fmtUsd(cost.input)} · cache write ${fmtUsd(cost.cache_write)} · cache read ${fmtUsd(cost.cache_read)} · output ${fmtUsd(cost.output)}`),
      card("Compaction savings", "savings_usd", fmtUsd(t.savings_usd), "what the uncompacted requests would have cost, minus what they cost"),
      card("Compaction events", "compaction_events", fmtInt(t.compaction_events)),
      card("Summary failures", "summary_failures", fmtInt(t.summary_failures)),
      card("Errors", "errors", fmtInt(t.errors)),
    ),
  );
  const cs = h("table", { class: "split" },
    h("caption", {}, "Cost split"),
    h("thead", {}, h("tr", {}, ["Part", "Tokens", "Cost"].map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {},
      [["Input", t.input_tokens, cost.input],
       ["Cache write", t.cache_creation_input_tokens, cost.cache_write],
       ["Cache read", t.cache_read_input_tokens, cost.cache_read],
       ["Output", t.output_tokens, cost.output],
       ["Total", null, cost.total]].map(([name, tokens, usd]) =>
        h("tr", {}, h("th", { scope: "row" }, name), h("td", {}, tokens === null ? "" : fmtInt(tokens)), h("td", {}, fmtUsd(usd))))));
  const series = data.series || [];
  const figures = h("div", { class: "charts", "data-since": data.since, "data-until": data.until, "data-bucket": data.bucket_seconds });
  const labels = series.map((b) => bucketLabel(b.start, data.bucket_seconds));
  view.append(h("h2", {}, "Over time"), figures, cs);
  figures.append(
    chart({
      title: "Input tokens over time",
      labels,
      series: [
        { key: "input_tokens", label: "uncached input", kind: "bar", values: series.map((b) => b.input_tokens) },
        { key: "cache_creation_input_tokens", label: "cache write", kind: "bar", values: series.map((b) => b.cache_creation_input_tokens) },
        { key: "cache_read_input_tokens", label: "cache read", kind: "bar", values: series.map((b) => b.cache_read_input_tokens) },
        { key: "tokens_saved", label: "tokens saved by compaction", kind: "line", values: series.map((b) => b.tokens_saved) },
      ],
    }),
    chart({
      title: "Cost and savings over time",
      labels,
      format: (v) => "$" + (v >= 1 ? v.toFixed(2) : v.toPrecision(2)),
      series: [
        { key: "cost_total", label: "cost (USD)", kind: "bar", values: series.map((b) => (b.cost_usd || {}).total) },
        { key: "savings_usd", label: "compaction savings (USD)", kind: "line", values: series.map((b) => b.savings_usd) },
      ],
    }),
    chart({
      title: "Requests, compactions and errors over time",
      labels,
      format: (v) => String(Math.round(v)),
      series: [
        { key: "client_calls", label: "requests", kind: "bar", values: series.map((b) => b.client_calls) },
        { key: "compaction_events", label: "compaction events", kind: "line", values: series.map((b) => b.compaction_events) },
        { key: "errors", label: "errors", kind: "line", values: series.map((b) => b.errors) },
      ],
    }),
  );
}
