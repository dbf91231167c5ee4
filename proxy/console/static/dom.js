// DOM helpers. Every piece of data becomes a text node or an attribute value: never HTML.
// (No HTML-parsing sink, no writing the document, no eval anywhere in the console: a test checks.)

const SAFE_HREF = /^\/console\//;

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

export function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "href" && !SAFE_HREF.test(String(value))) {
      throw new Error("console links stay inside /console/");
    }
    if (name.startsWith("on")) throw new Error("no inline handlers");
    el.setAttribute(name, value === true ? "" : String(value));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function link(path, text, attrs = {}) {
  return h("a", { ...attrs, href: path }, text);
}

export function table(caption, headers, rows) {
  return h(
    "table",
    {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows),
  );
}

export function fmtInt(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

// Money for people (the same rule as proxy/cli/figures.py): cents from a dollar up, grouped;
// two significant digits below ($0.052, $0.00012), at most six decimals. The API keeps the raw
// values; a figure that is not known is a dash, never $0.
export function fmtUsd(n) {
  if (n === null || n === undefined || !Number.isFinite(Number(n))) return "–";
  const v = Number(n);
  const a = Math.abs(v);
  const sign = v < 0 ? "-" : "";
  if (a >= 1 || a === 0) {
    return sign + "$" + a.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }
  const decimals = Math.min(6, Math.max(2, 1 - Math.floor(Math.log10(a))));
  const text = a.toFixed(decimals);
  return Number(text) === 0 ? sign + "<$0.000001" : sign + "$" + text;
}

// Money, or why there is none: a total whose models have no price says so.
export function fmtMoney(totals, value) {
  if ((value === null || value === undefined) && totals && (totals.unpriced_models || []).length) return "no price";
  return fmtUsd(value);
}

export function fmtPct(r) {
  if (r === null || r === undefined) return "–";
  return (Number(r) * 100).toFixed(1) + "%";
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function message(kind, text) {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text);
}
