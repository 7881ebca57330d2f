// #/kv/<bucket>: one key-value bucket: its options, its keys (filtered by
// prefix) with their current values, a key's history, and editing or deleting
// a value as a compare-and-set (If-Match: the revision shown, so a concurrent
// change is refused with 412 revision_mismatch instead of being overwritten).

import { api } from "../api.js";
import { card, confirmAction, createTable, emptyState, fill, h, scrollable, setAttr, setText, show, toast } from "../dom.js";
import { DASH, fmtAgo, fmtInt, fmtTime, plural } from "../format.js";
import { fmtTtl, keyPath, putExample } from "./buckets.js";

const KEYS_PAGE = 500; // keys per GET /v1/kv/<bucket> (page after page, while `more`)
const MAX_KEYS = 1000; // keys shown at most
const READ_PAGE = 5000; // revisions per GET /v1/kv-watch/<bucket>
const MAX_READ_PAGES = 20; // per poll: the next poll goes on from there
const MAX_GETS = 50; // single-key reads per poll (keys whose value the reads missed)
const PREVIEW_CHARS = 80;
const MAX_VALUE_CHARS = 100_000;

// Kept across visits: the prefix filter of each bucket and the keys' sort.
const state = { prefixes: new Map(), sort: { key: "key", dir: "asc" } };

const OPTIONS = [
  ["keys", "Keys", (v) => fmtInt(v)],
  ["revisions", "Revisions held", (v) => fmtInt(v)],
  ["revision", "Latest revision", (v) => (v == null ? DASH : String(v))],
  ["history", "History", (v) => (v == null ? DASH : `${plural(v, "revision")} per key`)],
  ["ttl", "TTL", (v) => fmtTtl(v)],
  ["max_revisions", "Max revisions", (v) => (v == null ? "unlimited" : fmtInt(v))],
  ["schema", "Schema", (v) => v ?? "none"],
  ["active_at", "Last active", (v) => fmtAgo(v)],
];

function rawSize(b64) {
  return Math.floor((b64.length * 3) / 4) - b64.match(/=*$/)[0].length;
}

/** A value on one line, cut to PREVIEW_CHARS ("…" while it is not read yet). */
function preview(e) {
  if (!e) return "…";
  if (e.value_base64 != null) return `${plural(rawSize(e.value_base64), "raw byte")} (base64)`;
  const text = JSON.stringify(e.value);
  return text.length > PREVIEW_CHARS ? text.slice(0, PREVIEW_CHARS - 1) + "…" : text;
}

function pretty(e) {
  const text = e.value_base64 != null ? e.value_base64 : JSON.stringify(e.value, null, 2);
  if (text.length <= MAX_VALUE_CHARS) return text;
  return text.slice(0, MAX_VALUE_CHARS) + `\n… (${fmtInt(text.length - MAX_VALUE_CHARS)} more characters)`;
}

/**
 * Where and why `text` is not JSON: {at, why} (at: an offset, or null), or
 * null when it is. JSON.parse decides; a strict scan of the same grammar then
 * finds the place, so the message is the same in every browser.
 */
export function jsonProblem(text) {
  let i = 0;
  const fail = (why) => {
    throw { at: i, why };
  };
  const found = () => (i < text.length ? `found ${JSON.stringify(text[i])}` : "found the end of the text");
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const word = (w) => {
    if (!text.startsWith(w, i)) fail(`expected a value, ${found()}`);
    i += w.length;
  };
  function string() {
    i++; // the opening quote
    while (i < text.length) {
      const c = text[i];
      if (c === '"') {
        i++;
        return;
      }
      if (c === "\\") {
        const e = text[i + 1];
        if (e === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) fail("a \\u escape needs four hex digits");
          i += 6;
          continue;
        }
        if (e === undefined || !'"\\/bfnrt'.includes(e)) fail("a bad escape in a string (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        i += 2;
        continue;
      }
      if (c < " ") fail("a line break or control character inside a string (write it as \\n)");
      i++;
    }
    fail('a string is not closed (a missing ")');
  }
  function number() {
    const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(i, i + 400));
    if (!m) fail(`expected a value, ${found()}`);
    i += m[0].length;
  }
  function value() {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      ws();
      if (text[i] === "}") {
        i++;
        return;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail(`expected a property name in double quotes, ${found()}`);
        string();
        ws();
        if (text[i] !== ":") fail(`expected ':' after a property name, ${found()}`);
        i++;
        value();
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return;
        }
        fail(`expected ',' or '}' after a property value, ${found()}`);
      }
    }
    if (c === "[") {
      i++;
      ws();
      if (text[i] === "]") {
        i++;
        return;
      }
      for (;;) {
        value();
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return;
        }
        fail(`expected ',' or ']' after an array item, ${found()}`);
      }
    }
    if (c === '"') return string();
    if (c === "t") return word("true");
    if (c === "f") return word("false");
    if (c === "n") return word("null");
    if (c === "-" || (c >= "0" && c <= "9")) return number();
    fail(`expected a value, ${found()}`);
  }
  if (!text.trim()) return { at: 0, why: 'the value is empty: give any JSON, e.g. 10, "text", [1, 2] or {"max": 10}' };
  let engine;
  try {
    JSON.parse(text);
    return null;
  } catch (exc) {
    engine = { at: null, why: exc.message };
  }
  try { // where and why, in the same words in every browser
    value();
    ws();
    if (i < text.length) fail(`unexpected ${JSON.stringify(text[i])} after the value`);
  } catch (exc) {
    if (exc && typeof exc.at === "number") return exc;
  }
  return engine; // the scan found nothing (or went too deep): the browser's own words
}

/** "line 2, column 9" of offset `at` in `text`. */
function lineColumn(text, at) {
  const before = text.slice(0, at);
  const line = before.split("\n").length;
  return `line ${line}, column ${at - before.lastIndexOf("\n")}`;
}

export function mount(view, params, ctx) {
  const bucket = params.bucket;
  const bp = encodeURIComponent(bucket);
  const keyUrl = (key) => `/v1/kv/${bp}/${keyPath(key)}`;

  // ------------------------------------------------------------ layout
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" },
    h("div", null,
      h("div", { class: "crumbs muted" }, h("a", { href: "#/kv" }, "Buckets"), " / "),
      h("h1", { "data-testid": "bucket-title" }, bucket),
      sub));

  const notFound = h("div", { class: "card", "data-testid": "bucket-missing", hidden: true },
    emptyState(`No bucket ${bucket}`,
      "A bucket appears when a value is first put in it. This page updates by itself. Try:",
      putExample(bucket)));

  // options
  const optionsCard = card("Options", { id: "bucket-options-title" });
  const optionsList = h("dl", { class: "kv", "data-testid": "bucket-options" });
  const optionEls = {};
  for (const [key, label] of OPTIONS) {
    optionEls[key] = h("dd", { "data-option": key }, DASH);
    optionsList.append(h("dt", null, label), optionEls[key]);
  }
  optionsCard.body.append(optionsList);

  // the selected key: its editor and its history
  const panelTitle = h("h2", { id: "key-panel-title" });
  const closeBtn = h("button", { type: "button", class: "btn btn-ghost btn-sm", "data-testid": "key-close" }, "Close");
  const panelHead = h("div", { class: "card-head" }, panelTitle, closeBtn);
  const panelBody = h("div", { class: "card-body" });
  const panel = h("section", {
    class: "card", "data-testid": "key-panel", "aria-labelledby": "key-panel-title", hidden: true,
  }, panelHead, panelBody);

  const editorLabel = h("label", { for: "value-input" });
  const editorInput = h("textarea", {
    id: "value-input", class: "editor", "data-testid": "value-input", rows: 8,
    spellcheck: "false", autocomplete: "off", autocapitalize: "off", "aria-describedby": "editor-error",
  });
  const editorStale = h("p", { class: "notice", "data-testid": "editor-stale", role: "status", hidden: true });
  const editorError = h("p", { id: "editor-error", class: "form-error", "data-testid": "editor-error", role: "alert", hidden: true });
  const saveBtn = h("button", { type: "submit", class: "btn btn-primary", "data-testid": "value-save" }, "Save");
  const cancelBtn = h("button", { type: "button", class: "btn", "data-testid": "value-cancel" }, "Cancel");
  const reloadBtn = h("button", { type: "button", class: "btn", "data-testid": "value-reload", hidden: true },
    "Start again from the current value");
  const editor = h("form", { class: "editor-form", "data-testid": "value-editor", novalidate: true, hidden: true },
    editorLabel, editorInput, editorStale, editorError, h("div", { class: "btn-row" }, saveBtn, cancelBtn, reloadBtn));

  const historyNote = h("p", { class: "muted small flush" });
  const historyTable = createTable({
    testid: "history-table",
    label: "History of the key, newest first",
    columns: [
      { key: "revision", label: "Revision", num: true, cell: (td, e) => setText(td, String(e.revision)) },
      {
        key: "op", label: "Operation",
        cell: (td, e) => fill(td, e.op, () => (e.op === "del"
          ? h("span", { class: "badge badge-danger", "data-testid": "history-op" }, "deleted")
          : h("span", { class: "badge", "data-testid": "history-op" }, "put"))),
      },
      {
        key: "value", label: "Value", class: "wrap",
        cell: (td, e) => fill(td, String(e.revision), () => (e.op === "del"
          ? h("span", { class: "muted" }, DASH)
          : [e.value_base64 != null ? h("div", { class: "raw-label" }, `${plural(rawSize(e.value_base64), "raw byte")} (base64)`) : null,
            scrollable(h("pre", { class: "value-pre", "data-testid": "history-value" }, pretty(e)), `revision ${e.revision} value`)])),
      },
      {
        key: "created", label: "Written", class: "nowrap",
        cell: (td, e) => {
          setText(td, fmtAgo(e.created));
          td.title = fmtTime(e.created);
        },
      },
      {
        key: "expires_at", label: "Expires", class: "nowrap",
        cell: (td, e) => {
          setText(td, e.expires_at ? fmtAgo(e.expires_at) : "never");
          td.title = fmtTime(e.expires_at);
        },
      },
    ],
    rowKey: (e) => e.revision,
    rowAttrs: (e) => ({ "data-revision": e.revision, "data-op": e.op }),
    empty: () => emptyState(null, "No revision of this key is stored (any more)."),
  });
  panelBody.append(editor, h("h3", { class: "subhead" }, "History"), historyNote, historyTable.el);

  // filter
  const filter = h("input", {
    id: "key-filter", type: "search", class: "filter", "data-testid": "key-filter",
    placeholder: "Filter by key prefix, e.g. app/", autocomplete: "off", spellcheck: "false", autocapitalize: "off",
  });
  filter.value = state.prefixes.get(bucket) || "";
  const toolbar = h("div", { class: "toolbar" },
    h("label", { for: "key-filter", class: "sr-only" }, "Filter keys by prefix"), filter);

  // keys
  const table = createTable({
    testid: "keys-table",
    label: `Keys of ${bucket}`,
    sort: state.sort,
    onSort: (sort) => { state.sort = sort; },
    columns: [
      {
        key: "key", label: "Key", sort: true, class: "key-cell",
        cell: (td, k) => {
          fill(td, k.key, () => h("button", {
            type: "button", class: "link", "data-testid": "key-link", title: "Show its history",
            onclick: () => select(k.key),
          }, k.key));
          setAttr(td.firstChild, "aria-pressed", k.key === selected ? "true" : "false");
        },
      },
      {
        key: "value", label: "Value", class: "value-cell",
        cell: (td, k) => fill(td, k.entry ? String(k.entry.revision) : "", () => h("code", {
          class: "preview", "data-testid": "key-value", title: k.entry ? pretty(k.entry).slice(0, 2000) : null,
        }, preview(k.entry))),
      },
      {
        key: "revision", label: "Revision", num: true, sort: true, value: (k) => (k.entry ? k.entry.revision : null),
        cell: (td, k) => setText(td, k.entry ? String(k.entry.revision) : "…"),
      },
      {
        key: "created", label: "Written", sort: true, class: "nowrap",
        value: (k) => -(k.entry ? k.entry.created : 0),
        cell: (td, k) => {
          const e = k.entry;
          setText(td, e ? fmtAgo(e.created) : "…");
          td.title = e ? fmtTime(e.created) + (e.expires_at ? ` · expires ${fmtTime(e.expires_at)}` : "") : "";
        },
      },
      {
        key: "actions", label: "Actions", class: "actions",
        cell: (td, k) => {
          fill(td, k.key, () => h("div", { class: "btn-row" },
            h("button", { type: "button", class: "btn btn-sm", "data-testid": "key-edit", "aria-label": `Edit key ${k.key}`, onclick: () => openEditor(k.key) }, "Edit"),
            h("button", { type: "button", class: "btn btn-sm btn-danger", "data-testid": "key-delete", "aria-label": `Delete key ${k.key}`, onclick: () => remove(k.key) }, "Delete")));
          const [edit, del] = td.querySelectorAll("button");
          const raw = !!(k.entry && k.entry.value_base64 != null);
          edit.disabled = !k.entry || raw;
          edit.title = raw ? "A raw (bytes) value: write it with a client" : "";
          del.disabled = !k.entry;
        },
      },
    ],
    rowKey: (k) => k.key,
    rowAttrs: (k) => ({ "data-key": k.key, "data-revision": k.entry ? k.entry.revision : null, "data-selected": k.key === selected }),
    empty: () => (prefix()
      ? emptyState(null, `No key starts with “${prefix()}”.`)
      : emptyState(null, "No key has a value (they were deleted or have expired).")),
  });
  const keysMore = h("p", { class: "muted table-note", "data-testid": "keys-more", hidden: true });
  const keysCard = card("Keys", { id: "keys-title",
    extra: h("span", { class: "hint muted" }, "select a key for its history") });
  keysCard.body.className = "";
  keysCard.body.append(table.el, keysMore);

  const content = h("div", { class: "grid" }, optionsCard.el, panel, toolbar, keysCard.el);
  view.replaceChildren(head, notFound, content);

  // ------------------------------------------------------------ state
  let alive = true;
  let info = null; // this bucket in GET /v1/kv
  let listed = { keys: [], more: false }; // the keys shown (at most MAX_KEYS)
  const cache = new Map(); // key -> its current entry (only keys shown)
  let cachePrefix = null; // the prefix the cache was read with
  let synced = 0; // the cache holds every change up to this revision
  let snapshot = true; // reading the current values (latest=true) until caught up
  let selected = null; // the key whose history is shown
  let history = null; // {key, at: bucket revision read at, entries}
  let edit = null; // {key, revision, refused}: the editor is open on that key, from that revision

  const prefix = () => state.prefixes.get(bucket) || "";

  function renderKeys() {
    const p = prefix();
    table.update(listed.keys.filter((k) => k.startsWith(p)).map((key) => ({ key, entry: cache.get(key) || null })));
    show(keysMore, listed.more);
    setText(keysMore, `Showing the first ${fmtInt(listed.keys.length)} keys` +
      (p ? ` starting with “${p}”` : info ? ` of ${fmtInt(info.keys)}` : "") +
      ": there are more. Narrow them with the prefix filter.");
  }

  let typing = null;
  filter.addEventListener("input", () => {
    state.prefixes.set(bucket, filter.value);
    renderKeys(); // at once, from what is shown; the broker's answer follows
    clearTimeout(typing);
    typing = setTimeout(() => ctx.refreshNow(), 250);
  });

  // ------------------------------------------------------------ the selected key
  function select(key) {
    if (selected === key) return;
    if (edit && edit.key !== key) closeEditor();
    selected = key;
    history = null;
    fill(panelTitle, key, () => ["Key ", h("code", { "data-testid": "key-panel-key" }, key)]);
    historyTable.update([]);
    setText(historyNote, "Loading…");
    panel.hidden = false;
    renderKeys();
    panel.scrollIntoView({ block: "nearest" });
    ctx.refreshNow();
  }

  closeBtn.addEventListener("click", () => {
    closeEditor();
    selected = null;
    history = null;
    panel.hidden = true;
    renderKeys();
  });

  /** The revision the key is at now (0: no value), from its history; null: not known. */
  function currentRevision(key) {
    if (!history || history.key !== key) return null;
    const last = history.entries[history.entries.length - 1];
    return last && last.op === "put" ? last.revision : 0;
  }

  function renderHistory() {
    if (!history) return;
    historyTable.update([...history.entries].reverse());
    const kept = info && info.history ? ` The bucket keeps ${plural(info.history, "revision")} per key.` : "";
    setText(historyNote, `${plural(history.entries.length, "revision")} stored, newest first.${kept}`);
    renderStale();
  }

  // ------------------------------------------------------------ the editor
  function openEditor(key, entry = cache.get(key)) {
    if (!entry) return;
    select(key);
    edit = { key, revision: entry.revision };
    editorInput.value = JSON.stringify(entry.value, null, 2);
    setText(editorLabel, `New value of “${key}” (JSON), replacing revision ${entry.revision}`);
    setEditorError(null);
    reloadBtn.hidden = true;
    editor.hidden = false;
    renderStale();
    editorInput.focus();
  }

  function closeEditor() {
    edit = null;
    editor.hidden = true;
    editorInput.value = "";
    setEditorError(null);
    editorStale.hidden = true;
  }

  function setEditorError(message) {
    setText(editorError, message || "");
    editorError.hidden = !message;
    editorInput.setAttribute("aria-invalid", message ? "true" : "false");
  }

  /** Say when the key moved on since the editor opened: saving would be refused. */
  function renderStale() {
    const now = edit ? currentRevision(edit.key) : null;
    const stale = now !== null && now !== edit.revision;
    if (stale) {
      setText(editorStale, now
        ? `“${edit.key}” changed since the editor opened: it is at revision ${now} now, ` +
          `not ${edit.revision}. Saving will be refused.`
        : `“${edit.key}” has no value any more (deleted or expired). Saving will be refused.`);
    }
    show(editorStale, stale);
    show(reloadBtn, stale || !!(edit && edit.refused));
  }

  cancelBtn.addEventListener("click", closeEditor);

  reloadBtn.addEventListener("click", async () => {
    if (!edit) return;
    const key = edit.key;
    try {
      const entry = await api("GET", keyUrl(key));
      if (!edit || edit.key !== key) return;
      if (entry.value_base64 != null) {
        setEditorError(`“${key}” holds raw bytes now: write them with a client.`);
        return;
      }
      openEditor(key, entry);
    } catch (exc) {
      if (!edit || edit.key !== key) return;
      if (exc.status !== 404) {
        setEditorError(exc.message);
        return;
      }
      // No value now: saving creates it (If-Match "0": only while it has none).
      edit = { key, revision: 0 };
      setText(editorLabel, `New value of “${key}” (JSON): it has no value now, saving creates it`);
      setEditorError(null);
      renderStale();
    }
  });

  editor.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!edit) return;
    const text = editorInput.value;
    const bad = jsonProblem(text);
    if (bad) { // nothing is sent
      setEditorError(`Not valid JSON${bad.at === null ? "" : ` at ${lineColumn(text, bad.at)}`}: ${bad.why}. Nothing was saved.`);
      editorInput.focus();
      if (bad.at !== null) editorInput.setSelectionRange(bad.at, Math.min(bad.at + 1, text.length));
      return;
    }
    const { key, revision } = edit;
    saveBtn.disabled = true;
    try {
      const res = await api("PUT", keyUrl(key), { body: text, headers: { "If-Match": `"${revision}"` } });
      if (edit && edit.key === key) closeEditor();
      toast(`saved '${key}' (revision ${res.revision})`);
    } catch (exc) {
      if (edit && edit.key === key) {
        edit.refused = exc.reason === "revision_mismatch";
        setEditorError(exc.reason === "revision_mismatch"
          ? `Not saved: “${key}” changed since the editor opened on revision ${revision} ` +
            `(${exc.message}). Your text is still here: start again from the current value, ` +
            "or copy your text first."
          : `Not saved: ${exc.message}`);
        renderStale();
      } else {
        toast(exc.message, { error: true });
      }
    } finally {
      saveBtn.disabled = false;
      ctx.refreshNow();
    }
  });

  // ------------------------------------------------------------ delete
  async function remove(key) {
    const entry = cache.get(key);
    if (!entry) return;
    const ok = await confirmAction({
      title: `Delete ${key}?`,
      text: `Its value (revision ${entry.revision}) is deleted; its history stays, ending with the delete. ` +
        "Refused if the key changed meanwhile.",
      yes: "Delete",
    });
    if (!ok) return;
    try {
      const res = await api("DELETE", keyUrl(key), { headers: { "If-Match": `"${entry.revision}"` } });
      toast(`deleted '${key}' (revision ${res.revision})`);
    } catch (exc) {
      toast(exc.reason === "revision_mismatch"
        ? `Not deleted: “${key}” changed meanwhile (${exc.message}). Look again before deleting.`
        : exc.message, { error: true });
    } finally {
      ctx.refreshNow();
    }
  }

  // ------------------------------------------------------------ refresh
  /** The keys with a value, page by page (`more`), at most MAX_KEYS. */
  async function listKeys(p) {
    const keys = [];
    let more = false;
    let after = "";
    do {
      const res = await api("GET", `/v1/kv/${bp}`,
        { query: { prefix: p, after, limit: Math.min(KEYS_PAGE, MAX_KEYS - keys.length) } });
      keys.push(...(res.keys || []));
      more = !!res.more;
      if (!res.keys || !res.keys.length) break;
      after = keys[keys.length - 1];
    } while (more && keys.length < MAX_KEYS);
    return { keys, more };
  }

  /** Bring the cache of current values up to the bucket's latest revision. */
  async function readValues(p, shown, upto) {
    if (p !== cachePrefix) {
      cache.clear();
      cachePrefix = p;
      synced = 0;
      snapshot = true;
    }
    const last = listed.more && shown.length ? shown[shown.length - 1] : null;
    const wanted = (key) => last === null || key <= last;
    for (let pages = 0; synced < upto && pages < MAX_READ_PAGES; pages++) {
      const res = await api("GET", `/v1/kv-watch/${bp}`, {
        query: { after: synced, prefix: p, limit: READ_PAGE, latest: snapshot ? "true" : null },
      });
      if (!alive || p !== cachePrefix) return;
      for (const e of res.entries || []) { // in revision order: the last one of a key wins
        if (e.op === "del") cache.delete(e.key);
        else if (wanted(e.key)) cache.set(e.key, e);
      }
      const moved = res.next > synced;
      synced = Math.max(synced, res.next);
      if (synced >= res.revision) snapshot = false;
      if (!moved || synced >= res.revision) break;
    }
    // A key listed whose value the reads did not bring (written between the two calls).
    const missing = shown.filter((k) => !cache.has(k)).slice(0, MAX_GETS);
    for (let i = 0; i < missing.length; i += 8) {
      await Promise.all(missing.slice(i, i + 8).map(async (key) => {
        try {
          const e = await api("GET", keyUrl(key));
          if (alive && p === cachePrefix) cache.set(key, e);
        } catch (exc) {
          if (exc.status !== 404) throw exc; // 404: gone since it was listed
        }
      }));
    }
    const keep = new Set(shown);
    for (const key of cache.keys()) if (!keep.has(key)) cache.delete(key);
  }

  async function refresh() {
    const p = prefix();
    const [all, keys] = await Promise.all([api("GET", "/v1/kv"), listKeys(p)]);
    if (!alive) return;
    info = (all.buckets || []).find((b) => b.bucket === bucket) || null;
    show(notFound, !info);
    show(content, !!info);
    if (!info) {
      setText(sub, "");
      cache.clear();
      cachePrefix = null;
      return;
    }
    setText(sub, `${plural(info.keys, "key")} · ${plural(info.revisions, "revision")} held · ` +
      `latest revision ${info.revision}`);
    for (const [key, , fmt] of OPTIONS) setText(optionEls[key], fmt(info[key]));

    if (p !== prefix()) return; // the filter changed meanwhile: the next poll follows
    listed = keys;
    await readValues(p, keys.keys, info.revision);
    if (!alive) return;
    renderKeys();

    const key = selected;
    if (key && (!history || history.key !== key || history.at !== info.revision)) {
      const entries = [];
      try {
        // a page of revisions at a time (a few MiB of values): the next one after the last
        for (let after = 0; ;) {
          const page = await api("GET", keyUrl(key), { query: { history: "true", after } });
          entries.push(...(page.entries || []));
          if (!page.more || !(page.entries || []).length || !alive || key !== selected) break;
          after = page.next;
        }
      } catch (exc) {
        if (exc.status !== 404) throw exc; // 404: no revision of it is stored
      }
      if (!alive || key !== selected) return;
      history = { key, at: info.revision, entries };
      renderHistory();
    }
    renderStale();
  }

  return {
    title: `${bucket} · Buckets`,
    refresh,
    destroy() {
      alive = false;
      clearTimeout(typing);
    },
  };
}
