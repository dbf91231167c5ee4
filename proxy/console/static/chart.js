// A small SVG chart: lines and bars over one x axis, with event markers.
// Every point carries its numbers as data attributes and an accessible label (tests read them).

const NS = "http://www.w3.org/2000/svg";
const W = 760;
const H = 260;
const PAD = { left: 64, right: 16, top: 16, bottom: 36 };

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// The axis top: four equal steps, each 1, 2, 2.5 or 5 times a power of ten; for counts
// (``integer``) every step is a whole number (at least 1, never 2.5 below 10), so the ticks of
// a chart of 1 request read 0, 1, 2, 3, 4, not 0, 0, 1, 1, 1.
export function niceMax(v, integer = false) {
  if (!(v > 0)) return integer ? 4 : 1;
  const raw = v / 4;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) {
    const step = m * p;
    if (integer && (step < 1 || !Number.isInteger(step))) continue;
    if (step >= raw) return 4 * step;
  }
  return 40 * p;
}

function short(n) {
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n * 100) / 100);
}

/**
 * chart({title, labels: [x label...], series: [{key, label, kind: "line"|"bar", values}],
 *        markers: [{index, label}], format: (n) => string, integer: bool})
 * ``integer``: the values are counts (requests, tokens): the axis ticks are whole numbers.
 * Returns a <figure> with the SVG (role="img", named by title) and a legend.
 */
export function chart({ title, labels, series, markers = [], format = short, integer = false }) {
  const n = labels.length;
  const values = series.flatMap((x) => x.values).filter((v) => Number.isFinite(v));
  const max = niceMax(Math.max(0, ...values), integer);
  const iw = W - PAD.left - PAD.right;
  const ih = H - PAD.top - PAD.bottom;
  const step = n > 0 ? iw / n : iw;
  const xOf = (i) => PAD.left + step * (i + 0.5);
  const yOf = (v) => PAD.top + ih - (ih * Math.max(0, v)) / max;

  const svg = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-label": title,
    class: "chart",
    "data-points": n,
    "data-max": max,
    "data-integer": integer ? "true" : "false",
  });
  svg.append(s("title", {}, title));

  // Axes and grid.
  for (let t = 0; t <= 4; t++) {
    const v = (max * t) / 4;
    const y = yOf(v);
    svg.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: y, y2: y, class: "grid" }));
    svg.append(s("text", { x: PAD.left - 6, y: y + 4, class: "tick", "text-anchor": "end", "data-tick": v }, format(v)));
  }
  const every = Math.max(1, Math.ceil(n / 8));
  labels.forEach((label, i) => {
    if (i % every === 0) {
      svg.append(s("text", { x: xOf(i), y: H - PAD.bottom + 16, class: "tick", "text-anchor": "middle" }, label));
    }
  });

  // Markers (e.g. compaction events) behind the data.
  for (const m of markers) {
    const x = xOf(m.index);
    const g = s("g", { class: "marker", "data-marker-index": m.index, "aria-label": m.label, role: "img" });
    g.append(s("title", {}, m.label));
    g.append(s("line", { x1: x, x2: x, y1: PAD.top, y2: PAD.top + ih }));
    g.append(s("path", { d: `M${x - 5},${PAD.top} L${x + 5},${PAD.top} L${x},${PAD.top + 8} Z` }));
    svg.append(g);
  }

  // Bars, grouped per x.
  const bars = series.filter((x) => x.kind === "bar");
  const bw = bars.length ? Math.max(1, (step * 0.8) / bars.length) : 0;
  bars.forEach((ser, b) => {
    const g = s("g", { class: `series s${series.indexOf(ser)}`, "data-series": ser.key });
    ser.values.forEach((v, i) => {
      const value = Number.isFinite(v) ? v : 0;
      const x = PAD.left + step * i + step * 0.1 + bw * b;
      const y = yOf(value);
      const label = `${ser.label} · ${labels[i]}: ${format(value)}`;
      const r = s("rect", {
        x, y, width: bw, height: Math.max(0, PAD.top + ih - y),
        "data-series": ser.key, "data-index": i, "data-x": labels[i], "data-value": value,
        "aria-label": label,
      });
      r.append(s("title", {}, label));
      g.append(r);
    });
    svg.append(g);
  });

  // Lines with a point per x.
  series.filter((x) => x.kind !== "bar").forEach((ser) => {
    const g = s("g", { class: `series s${series.indexOf(ser)}`, "data-series": ser.key });
    const pts = ser.values.map((v, i) => `${xOf(i)},${yOf(Number.isFinite(v) ? v : 0)}`);
    if (pts.length > 1) g.append(s("polyline", { points: pts.join(" "), fill: "none" }));
    ser.values.forEach((v, i) => {
      const value = Number.isFinite(v) ? v : 0;
      const label = `${ser.label} · ${labels[i]}: ${format(value)}`;
      const c = s("circle", {
        cx: xOf(i), cy: yOf(value), r: 3,
        "data-series": ser.key, "data-index": i, "data-x": labels[i], "data-value": value,
        "aria-label": label,
      });
      c.append(s("title", {}, label));
      g.append(c);
    });
    svg.append(g);
  });

  const figure = document.createElement("figure");
  figure.className = "chart";
  const heading = document.createElement("p");
  heading.className = "chart-title";
  heading.textContent = title;
  figure.append(heading, svg);
  const legend = document.createElement("figcaption");
  legend.className = "legend";
  series.forEach((ser, i) => {
    const item = document.createElement("span");
    item.className = `key s${i} ${ser.kind === "bar" ? "bar" : "line"}`;
    item.textContent = ser.label;
    legend.append(item);
  });
  if (markers.length) {
    const item = document.createElement("span");
    item.className = "key marker";
    item.textContent = "compaction event";
    legend.append(item);
  }
  figure.append(legend);
  return figure;
}
