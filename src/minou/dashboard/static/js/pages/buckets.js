// #/kv: the key-value buckets (GET /v1/kv), each a channel _kv/v1/<bucket>:
// its keys, revisions held, options and when it was last written.

import { api, session } from "../api.js";
import { card, createTable, emptyState, fill, h, setText } from "../dom.js";
import { fmtAgo, fmtDuration, fmtInt, fmtTime, plural } from "../format.js";

// Kept across visits.
const state = { sort: { key: "bucket", dir: "asc" } };

export function bucketHref(bucket) {
  return `#/kv/${bucket}`;
}

/** Path of a key ("app/a.b"): each segment encoded (the API takes "/" in keys). */
export function keyPath(key) {
  return key.split("/").map(encodeURIComponent).join("/");
}

export function putExample(bucket = "config") {
  const auth = session.dev ? "" : ' -H "Authorization: Bearer $TOKEN"';
  return `curl -XPUT${auth} ${location.origin}/v1/kv/${bucket}/limit -d '{"max": 10}'`;
}

/** "none" / "5 min" (a value's time to live). */
export function fmtTtl(v) {
  return v == null ? "none" : fmtDuration(v);
}

export function mount(view) {
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" }, h("div", null, h("h1", null, "Buckets"), sub));

  let last = null;
  const table = createTable({
    testid: "buckets-table",
    label: "Key-value buckets",
    sort: state.sort,
    onSort: (sort) => { state.sort = sort; },
    columns: [
      {
        key: "bucket", label: "Bucket", sort: true, class: "nowrap",
        cell: (td, b) => fill(td, b.bucket, () => h("a", { href: bucketHref(b.bucket), "data-testid": "bucket-link" }, b.bucket)),
      },
      {
        key: "keys", label: "Keys", num: true, sort: true, title: "Keys with a value (deleted and expired ones not counted)",
        cell: (td, b) => setText(td, fmtInt(b.keys)),
      },
      {
        key: "revisions", label: "Revisions", num: true, sort: true, title: "Revisions held, over every key (history included)",
        cell: (td, b) => setText(td, fmtInt(b.revisions)),
      },
      {
        key: "history", label: "History", num: true, sort: true, title: "Revisions kept per key",
        cell: (td, b) => setText(td, fmtInt(b.history)),
      },
      {
        key: "ttl", label: "TTL", num: true, sort: true, value: (b) => b.ttl ?? Infinity,
        cell: (td, b) => setText(td, fmtTtl(b.ttl)),
      },
      {
        key: "active_at", label: "Last active", sort: true, class: "nowrap", value: (b) => -(b.active_at || 0),
        cell: (td, b) => {
          setText(td, fmtAgo(b.active_at));
          td.title = fmtTime(b.active_at);
        },
      },
    ],
    rowKey: (b) => b.bucket,
    rowAttrs: (b) => ({ "data-bucket": b.bucket }),
    empty: () => emptyState("No buckets yet",
      "A bucket appears when the first value is put in it (client.kv(\"config\").put(...), " +
      "minou kv put, or the HTTP API). Try:", putExample()),
  });
  const bucketsCard = card(null);
  bucketsCard.body.className = "";
  bucketsCard.body.append(table.el);

  view.replaceChildren(head, bucketsCard.el);

  let alive = true;

  async function refresh() {
    const data = await api("GET", "/v1/kv");
    if (!alive) return;
    last = data.buckets || [];
    table.update(last);
    const keys = last.reduce((n, b) => n + (b.keys || 0), 0);
    setText(sub, `${plural(last.length, "bucket")} · ${plural(fmtInt(keys), "key")}`);
  }

  return {
    title: "Buckets",
    refresh,
    destroy() {
      alive = false;
    },
  };
}
