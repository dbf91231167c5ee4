// Same-origin JSON reads. The console cookie authorises GETs of the admin API.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function getJson(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") query.set(k, String(v));
  }
  const qs = query.toString();
  const response = await fetch(path + (qs ? "?" + qs : ""), {
    credentials: "same-origin",
    headers: { Accept: "application/json" },
    cache: "no-store",
    redirect: "error",
  });
  if (response.status === 401) {
    window.location.assign("/console/signin");
    throw new ApiError(401, "signed out");
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const text = body && body.error && (body.error.message || body.error);
    throw new ApiError(response.status, typeof text === "string" ? text : "HTTP " + response.status);
  }
  return body;
}

export const admin = (path, params) => getJson("/admin/v1" + path, params);
export const enc = encodeURIComponent;

let me = null;
// {tenant, ledger}: who is signed in, and whether this proxy serves the usage ledger.
export function whoami() {
  if (me === null) me = getJson("/console/api/me");
  return me;
}
