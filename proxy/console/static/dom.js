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

export function fmtUsd(n) {
  if (n === null || n === undefined) return "–";
  const v = Number(n);
  return (v < 0 ? "-$" : "$") + Math.abs(v).toFixed(Math.abs(v) < 1 ? 4 : 2);
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
