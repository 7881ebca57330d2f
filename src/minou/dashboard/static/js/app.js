// The minou admin dashboard: sign-in, the shell, hash routing and polling.
// Plain ES modules, no build step; uPlot (vendor/) is the only library.

import { api, ApiError, onUnauthorized, saveToken, session } from "./api.js";
import { h } from "./dom.js";
import * as bucketPage from "./pages/bucket.js";
import * as bucketsPage from "./pages/buckets.js";
import * as clientsPage from "./pages/clients.js";
import * as clusterPage from "./pages/cluster.js";
import * as federationPage from "./pages/federation.js";
import * as overviewPage from "./pages/overview.js";
import * as queuePage from "./pages/queue.js";
import * as queuesPage from "./pages/queues.js";

const POLL_MS = 2000;
const NOT_ADMIN = "this identity is not an admin";

const $ = (sel) => document.querySelector(sel);
const els = {
  boot: $("#boot"),
  signin: $("#signin-screen"),
  form: $("[data-testid=signin]"),
  input: $("[data-testid=token-input]"),
  signinError: $("[data-testid=signin-error]"),
  signinButton: $("[data-testid=signin-button]"),
  shell: $("#shell"),
  view: $("#view"),
  main: $("#main"),
  skip: $("[data-testid=skip-link]"),
  banner: $("#banner"),
  sessionNote: $("#session-note"),
  identity: $("#identity"),
  devSlot: $("#dev-badge-slot"),
  theme: $("[data-testid=theme-toggle]"),
  signout: $("[data-testid=signout]"),
};

/* ------------------------------------------------------------------ theme */

const THEME_KEY = "minou.theme";
const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");

function effectiveTheme() {
  return document.documentElement.dataset.theme || (darkQuery.matches ? "dark" : "light");
}
const root = document.documentElement;

function syncThemeButton() {
  const next = effectiveTheme() === "dark" ? "light" : "dark";
  els.theme.setAttribute("aria-label", `Switch to the ${next} theme`);
  els.theme.title = `Switch to the ${next} theme`;
  els.theme.dataset.theme = effectiveTheme();
}

els.theme.addEventListener("click", () => {
  const next = effectiveTheme() === "dark" ? "light" : "dark";
  root.dataset.theme = next;
  delete root.dataset.themeAuto;
  try {
    localStorage.setItem(THEME_KEY, next);
  } catch { /* not persisted */ }
  syncThemeButton();
  window.dispatchEvent(new Event("minou:theme"));
});
darkQuery.addEventListener("change", () => {
  if (!root.dataset.themeAuto) return;  // the user chose a theme: keep it
  root.dataset.theme = darkQuery.matches ? "dark" : "light";
  syncThemeButton();
  window.dispatchEvent(new Event("minou:theme"));
});
syncThemeButton();

/* ------------------------------------------------------------------ routes */

const ROUTES = [
  { re: /^\/overview$/, page: overviewPage, nav: "overview" },
  { re: /^\/queues$/, page: queuesPage, nav: "queues" },
  {
    re: /^\/queues\/(_dead\/)?([A-Za-z0-9_-]+)\/([^/]+)$/, page: queuePage, nav: "queues",
    params: (m) => ({ dead: !!m[1], endpoint: m[2], version: decodeURIComponent(m[3]) }),
  },
  { re: /^\/kv$/, page: bucketsPage, nav: "kv" },
  {
    re: /^\/kv\/([A-Za-z0-9_-]{1,64})$/, page: bucketPage, nav: "kv",
    params: (m) => ({ bucket: m[1] }),
  },
  { re: /^\/clients$/, page: clientsPage, nav: "clients" },
  { re: /^\/cluster$/, page: clusterPage, nav: "cluster" },
  { re: /^\/federation$/, page: federationPage, nav: "federation" },
];

function parseHash() {
  const path = (location.hash || "").replace(/^#/, "").replace(/\/+$/, "") || "/overview";
  for (const r of ROUTES) {
    const m = path.match(r.re);
    if (m) return { ...r, path, params: r.params ? r.params(m) : {} };
  }
  return null;
}

let current = null; // {page instance, path}
let loadingTimer = null;

function route() {
  if (els.shell.hidden) return;
  const r = parseHash();
  if (!r) {
    location.replace("#/overview");
    return;
  }
  if (current && current.path === r.path) return;
  unmount();
  for (const a of document.querySelectorAll(".nav a")) {
    if (a.dataset.route === r.nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  setBanner(null);
  // Until its first data is drawn the view shows its heading only: what comes in then
  // appears at once instead of pushing what was drawn empty down (layout shift).
  els.view.classList.add("loading");
  clearTimeout(loadingTimer);
  loadingTimer = setTimeout(() => els.view.classList.remove("loading"), 3000);
  const instance = r.page.mount(els.view, r.params, { refreshNow: poll });
  current = { instance, path: r.path };
  document.title = `${instance.title} · minou`;
  focusHeading();
  poll();
}

/* ------------------------------------------------------------------ focus */

/** Focus the view's heading (after a navigation, a sign-in, the skip link). */
function focusHeading() {
  const heading = els.view.querySelector("h1") || els.main;
  if (heading !== els.main) heading.tabIndex = -1;
  heading.focus({ preventScroll: true });
}

els.skip.addEventListener("click", (e) => {
  e.preventDefault(); // "#main" is not a route
  focusHeading();
  els.main.scrollIntoView();
});

// The focused control went away (a row re-drawn, an Approve done, a button now
// disabled): focus goes to the view's heading, never to the page's body. A click on
// a blank spot leaves the body focused, as browsers do (the control is still there).
let lastFocused = null;
document.addEventListener("focusin", (e) => { lastFocused = e.target; });

function focusLost() {
  const active = document.activeElement;
  if (active && active !== document.body) return;
  const gone = lastFocused;
  if (!gone || els.shell.hidden || document.querySelector("dialog[open]")) return;
  if (!gone.isConnected || gone.disabled || gone.closest("[hidden]")) {
    lastFocused = null;
    focusHeading();
  }
}
new MutationObserver(() => setTimeout(focusLost, 0)).observe(els.view, {
  childList: true, subtree: true, attributes: true, attributeFilter: ["disabled", "hidden"],
});

function unmount() {
  if (current) {
    current.instance.destroy();
    current = null;
  }
  els.view.replaceChildren();
}

window.addEventListener("hashchange", route);

/* ------------------------------------------------------------------ polling */

let timer = null;
let inflight = null;
let again = false;

/** Refresh the visible page now, then every POLL_MS (never two at once). */
async function poll() {
  clearTimeout(timer);
  timer = null;
  if (!current) return;
  if (inflight) {
    again = true;
    return inflight;
  }
  const mine = current;
  inflight = (async () => {
    if (document.hidden) return; // a hidden tab polls nothing; it catches up when shown
    try {
      await mine.instance.refresh();
      if (mine === current) setBanner(null);
    } catch (exc) {
      if (mine === current) pollFailed(exc);
    }
    if (mine === current) els.view.classList.remove("loading");
  })();
  await inflight;
  inflight = null;
  if (again) {
    again = false;
    return poll();
  }
  if (current && !timer) timer = setTimeout(poll, POLL_MS);
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && current) poll();
});

function pollFailed(exc) {
  if (!(exc instanceof ApiError)) {
    console.error(exc);
    setBanner(`This page failed: ${exc && exc.message ? exc.message : exc}`, true);
    return;
  }
  if (exc.status === 401) return; // back to the sign-in screen already
  if (exc.status === 0) setBanner(`The broker is not answering (${exc.message}). Retrying every ${POLL_MS / 1000} s…`);
  else setBanner(`${exc.message} (HTTP ${exc.status})`, true);
}

function setBanner(text, error = false) {
  if (!text) {
    els.banner.hidden = true;
    return;
  }
  els.banner.textContent = text;
  els.banner.classList.toggle("error", error);
  els.banner.hidden = false;
}

/* ------------------------------------------------------------------ sign-in */

function showSignin(message = null) {
  stop();
  clearInterval(sessionTimer);
  els.sessionNote.hidden = true;
  els.boot.hidden = true;
  els.shell.hidden = true;
  els.signin.hidden = false;
  setSigninError(message);
  document.title = "Sign in · minou";
  els.input.focus();
}

function setSigninError(message) {
  els.signinError.textContent = message || "";
  els.signinError.hidden = !message;
  els.input.setAttribute("aria-invalid", message ? "true" : "false");
}

function stop() {
  clearTimeout(timer);
  timer = null;
  unmount();
}

/** Ask the broker who this token is; resolve the identity or throw a message. */
async function whoami(token) {
  let who;
  try {
    who = await api("GET", "/v1/whoami", { token, signin: true });
  } catch (exc) {
    throw exc instanceof ApiError ? exc.message : String(exc);
  }
  if (!who || !who.admin) throw NOT_ADMIN;
  return who;
}

els.form.addEventListener("submit", async (e) => {
  e.preventDefault();
  const token = els.input.value.trim();
  if (!token) {
    setSigninError("paste a token first");
    return;
  }
  els.signinButton.disabled = true;
  try {
    const who = await whoami(token);
    saveToken(token);
    els.input.value = "";
    enter(who, false);
  } catch (message) {
    setSigninError(String(message));
  } finally {
    els.signinButton.disabled = false;
  }
});

els.signout.addEventListener("click", () => {
  saveToken(null);
  session.identity = null;
  session.dev = false;
  showSignin(null);
});

onUnauthorized((message) => {
  if (els.shell.hidden) return;
  saveToken(null);
  session.identity = null;
  showSignin(message);
});

function enter(who, dev) {
  session.identity = who;
  session.dev = dev;
  els.boot.hidden = true;
  els.signin.hidden = true;
  els.shell.hidden = false;
  setSigninError(null);
  els.devSlot.replaceChildren(dev
    ? h("span", { class: "badge badge-dev", "data-testid": "dev-badge",
      title: "The broker runs with --dev: no authentication, loopback only" }, "development mode")
    : "");
  // Development mode has nobody to sign out: the broker lets every local caller in.
  els.identity.textContent = dev
    ? "development mode: no sign-in"
    : `signed in as ${who.client_id}${who.method ? ` (${who.method})` : ""}`;
  els.signout.hidden = dev;
  if (!location.hash || location.hash === "#" || location.hash === "#/") location.replace("#/overview");
  watchSession();
  route();
}

/** The broker's public health: whether it asks for a token at all ("auth": "off" in
 * development mode). Asking it is no refused request: loading the sign-in page
 * counts nothing and logs nothing. */
async function probeAuth() {
  const res = await fetch("/health", { cache: "no-store", credentials: "omit" });
  const body = await res.json();
  return body && body.auth;
}

async function boot() {
  let auth;
  try {
    auth = await probeAuth();
  } catch (exc) {
    showSignin(`The broker is not answering: ${exc && exc.message ? exc.message : exc}`);
    return;
  }
  if (auth === "off") { // development mode: the broker answers without a token
    try {
      const who = await api("GET", "/v1/whoami", { token: null, signin: true });
      if (who && who.admin) {
        enter(who, true);
        return;
      }
    } catch { /* then a token it is */ }
  }
  if (session.token) {
    try {
      enter(await whoami(session.token), false);
    } catch (message) {
      saveToken(null);
      showSignin(String(message));
    }
    return;
  }
  showSignin(null);
}

/* ------------------------------------------------------------ session end */

// A JWT's "exp" says when the broker stops taking it. The page cannot renew it (an
// admin's key signs tokens, and the page never holds the key), so it says so ahead:
// from WARN_S before the end a notice gives the time left, and at the end the page
// goes back to the sign-in screen with the reason. A broker token has no end.
const WARN_S = 300;
let sessionTimer = null;

function tokenExpiry(token) {
  try {
    const part = token.split(".")[1];
    const json = atob(part.replace(/-/g, "+").replace(/_/g, "/"));
    const exp = JSON.parse(json).exp;
    return typeof exp === "number" ? exp : null;
  } catch {
    return null;
  }
}

function watchSession() {
  clearInterval(sessionTimer);
  sessionTimer = null;
  els.sessionNote.hidden = true;
  const exp = session.token && !session.dev ? tokenExpiry(session.token) : null;
  if (exp === null) return;
  const check = () => {
    const left = exp - Date.now() / 1000;
    if (left <= 0) {
      clearInterval(sessionTimer);
      saveToken(null);
      session.identity = null;
      showSignin(`Your token expired at ${new Date(exp * 1000).toLocaleTimeString()}: ` +
        "sign in with a new one (minou admin-token).");
      return;
    }
    if (left > WARN_S) {
      els.sessionNote.hidden = true;
      return;
    }
    const minutes = Math.max(1, Math.round(left / 60));
    els.sessionNote.textContent = `Your session ends in ${minutes} min ` +
      `(the token expires at ${new Date(exp * 1000).toLocaleTimeString()}): ` +
      "sign in again with a new token (minou admin-token) to go on.";
    els.sessionNote.hidden = false;
  };
  check();
  sessionTimer = setInterval(check, 10_000);
}

boot();
