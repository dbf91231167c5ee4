// Overview: the tenant's usage over a chosen time range (the usage ledger's summary).
import { admin, whoami } from "./api.js";
import { chart } from "./chart.js";
import { append, fmtInt, fmtMoney, fmtPct, fmtUsd, h, message } from "./dom.js";
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

export function card(name, figure, value, detail, raw) {
  return h("section", { class: "card", "aria-label": name },
    h("h2", {}, name),
    h("p", { class: "figure", "data-figure": figure, "data-value": raw }, value),
    detail ? h("p", { class: "detail" }, detail) : null);
}

// A model with tokens and no price: said in the API's own words, never shown as $0.
export function unpricedNote(totals) {
  return totals && totals.unpriced_note ? message("notice", totals.unpriced_note) : null;
}

// Where clients send requests: this origin, or (with listen.admin_port) the client port.
function clientUrl(me) {
  if (!me.client_port) return location.origin;
  return `${location.protocol}//${location.hostname}:${me.client_port}`;
}

// A range without a request: how to send the first one (an agent, the SDK, or the keyless demo).
function firstRequest(me) {
  const url = clientUrl(me);
  return h("section", { class: "card empty", "aria-label": "Send the first request" },
    h("h2", {}, "No request in this time range yet"),
    h("p", {}, "Point a client's base URL at the proxy; every request then shows here."),
    h("pre", {}, [
      `# Claude Code\nANTHROPIC_BASE_URL=${url} claude`,
      `# the Python SDK (your API key as usual)\nanthropic.Anthropic(base_url="${url}")`,
      "# no key at hand: the demo (its own proxy on port 8080), then its agent loop\n"
        + "context-proxy serve --demo\npython examples/demo_agent_loop.py",
    ].join("\n\n")));
}

export async function overviewPage(view, navigate) {
  document.title = "Overview · context-proxy console";
  const params = new URLSearchParams(location.search);
  const range = rangeOf(params.get("range"));
  view.append(h("h1", {}, "Overview"));
  view.append(rangePicker(range.key, (key) => navigate("/console/?range=" + encodeURIComponent(key))));
  const [since, until] = window_(range);
  const me = await whoami();
  if (!me.ledger) return ledgerMissing(view);
  const data = await admin("/usage/summary", { since, until, bucket: range.bucket });
  const t = data.totals;
  const cost = t.cost_usd || {};
  append(view, [
    h("p", { class: "detail" }, `From ${data.since} to ${data.until}`),
    h("div", { class: "cards" },
      card("Requests", "client_calls", fmtInt(t.client_calls),
        `${fmtInt(t.calls)} upstream calls: ${fmtInt(t.summary_calls)} summary, ${fmtInt(t.retrieval_calls)} retrieval`),
      card("Tokens saved", "tokens_saved", fmtInt(t.tokens_saved),
        `${fmtPct(t.tokens_saved_ratio)} of input: ${fmtInt(t.tokens_before)} before compaction, ${fmtInt(t.tokens_after)} after`),
      card("Compaction savings", "savings_usd", fmtMoney(t, t.savings_usd), "what the uncompacted requests would have cost, minus what they cost", t.savings_usd),
      card("Cost", "cost_total", fmtMoney(t, cost.total),
        t.cost_usd ? `input ${fmtUsd(cost.input)} · cache write ${fmtUsd(cost.cache_write)} · cache read ${fmtUsd(cost.cache_read)} · output ${fmtUsd(cost.output)}` : null,
        cost.total),
      card("Cache hit ratio", "cache_hit_ratio", fmtPct(t.cache_hit_ratio),
        `${fmtInt(t.cache_read_input_tokens)} of ${fmtInt(t.total_input_tokens)} input tokens read from the cache`),
      card("Compaction events", "compaction_events", fmtInt(t.compaction_events)),
      card("Summary failures", "summary_failures", fmtInt(t.summary_failures)),
      card("Errors", "errors", fmtInt(t.errors)),
    ),
    unpricedNote(t),
  ]);
  if (!t.calls) {
    view.append(firstRequest(me));
    return;
  }
  const cs = h("table", { class: "split" },
    h("caption", {}, "Cost split"),
    h("thead", {}, h("tr", {}, ["Part", "Tokens", "Cost"].map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {},
      [["Input", t.input_tokens, cost.input],
       ["Cache write", t.cache_creation_input_tokens, cost.cache_write],
       ["Cache read", t.cache_read_input_tokens, cost.cache_read],
       ["Output", t.output_tokens, cost.output],
       ["Total", null, cost.total]].map(([name, tokens, usd]) =>
        h("tr", {}, h("th", { scope: "row" }, name), h("td", {}, tokens === null ? "" : fmtInt(tokens)), h("td", {}, fmtMoney(t, usd))))));
  const series = data.series || [];
  const figures = h("div", { class: "charts", "data-since": data.since, "data-until": data.until, "data-bucket": data.bucket_seconds });
  const labels = series.map((b) => bucketLabel(b.start, data.bucket_seconds));
  view.append(h("h2", {}, "Over time"), figures, cs);
  figures.append(
    chart({
      title: "Input tokens over time",
      labels,
      integer: true,
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
      format: (v) => fmtUsd(v),
      series: [
        { key: "cost_total", label: "cost (USD)", kind: "bar", values: series.map((b) => (b.cost_usd || {}).total) },
        { key: "savings_usd", label: "compaction savings (USD)", kind: "line", values: series.map((b) => b.savings_usd) },
      ],
    }),
    chart({
      title: "Requests, compactions and errors over time",
      labels,
      integer: true,
      format: (v) => String(v),
      series: [
        { key: "client_calls", label: "requests", kind: "bar", values: series.map((b) => b.client_calls) },
        { key: "compaction_events", label: "compaction events", kind: "line", values: series.map((b) => b.compaction_events) },
        { key: "errors", label: "errors", kind: "line", values: series.map((b) => b.errors) },
      ],
    }),
  );
}
