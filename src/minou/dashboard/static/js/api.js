// The broker's HTTP API (docs/http.md): fetch with the bearer token, JSON
// errors turned into ApiError (status, reason, the API's message).

const TOKEN_KEY = "minou.token";

export const session = {
  token: readToken(),
  dev: false, // development mode: no token needed
  identity: null, // GET /v1/whoami
};

function readToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || null;
  } catch {
    return null;
  }
}

export function saveToken(token) {
  session.token = token;
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lives until the page closes */ }
}

export class ApiError extends Error {
  constructor(status, reason, message, body = null) {
    super(message);
    this.name = "ApiError";
    this.status = status; // 0: the broker did not answer
    this.reason = reason;
    this.body = body;
  }
}

let unauthorized = null;

/** fn(message) is called on any 401 of an authenticated call (then the call throws). */
export function onUnauthorized(fn) {
  unauthorized = fn;
}

/**
 * api("GET", "/v1/status") -> parsed JSON.
 * opts.query: {name: value} (null/undefined skipped); opts.token: use this token
 * (null: none) instead of the session's; opts.signin: a sign-in probe (a 401
 * does not trigger the global handler); opts.body: a JSON text to send;
 * opts.headers: more request headers (e.g. If-Match).
 */
export async function api(method, path, opts = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(opts.query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json", ...(opts.headers || {}) };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const token = "token" in opts ? opts.token : session.token;
  if (token) headers.Authorization = `Bearer ${token}`;
  let res;
  try {
    res = await fetch(url, { method, headers, body: opts.body, cache: "no-store", credentials: "omit" });
  } catch (exc) {
    if (token && /header|ISO-8859|code point/i.test(String(exc && exc.message))) {
      throw new ApiError(400, "bad_token", "the token contains characters that cannot be sent");
    }
    throw new ApiError(0, "unreachable", `the broker did not answer (${exc && exc.message || exc})`);
  }
  const text = await res.text();
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!res.ok) {
    const err = body && body.error;
    const message = (err && err.message) || `HTTP ${res.status}${res.statusText ? " " + res.statusText : ""}`;
    const exc = new ApiError(res.status, err && err.reason, message, body);
    if (res.status === 401 && !opts.signin && unauthorized) unauthorized(message);
    throw exc;
  }
  return body;
}

/** Path segment(s) of a queue name ("orders/v1", "_dead/orders/v1"): each part encoded. */
export function queuePath(queue) {
  return queue.split("/").map(encodeURIComponent).join("/");
}

/** The channel id of "orders/v1/42" (or "_dead/orders/v1/42"): "42". */
export function channelId(channel, queue) {
  return channel.startsWith(queue + "/") ? channel.slice(queue.length + 1) : channel.split("/").slice(2).join("/");
}
