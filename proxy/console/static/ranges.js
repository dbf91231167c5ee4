// Time ranges the pages offer, and the chart bucket for each.
export const RANGES = [
  { key: "1h", label: "Last hour", seconds: 3600, bucket: 300 },
  { key: "24h", label: "Last 24 hours", seconds: 86400, bucket: 3600 },
  { key: "7d", label: "Last 7 days", seconds: 7 * 86400, bucket: 6 * 3600 },
  { key: "30d", label: "Last 30 days", seconds: 30 * 86400, bucket: 86400 },
];

export function rangeOf(key, fallback = "24h") {
  return RANGES.find((r) => r.key === key) || RANGES.find((r) => r.key === fallback);
}

// [since, until] as ISO strings; until is the next whole minute (stable while paging).
export function window_(range, now = Date.now()) {
  const until = Math.ceil(now / 60000) * 60000;
  return [new Date(until - range.seconds * 1000).toISOString(), new Date(until).toISOString()];
}

export function bucketLabel(iso, bucketSeconds) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const t = d.toISOString();
  return bucketSeconds >= 86400 ? t.slice(5, 10) : bucketSeconds >= 6 * 3600 ? t.slice(5, 13) + "h" : t.slice(11, 16);
}
