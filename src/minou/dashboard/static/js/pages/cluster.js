// #/cluster: the brokers sharing this broker's storage (several on one Redis), which
// one is the primary, the queues with their fencing epochs, the recent takeovers and
// this broker's lease counters (GET /v1/cluster). On SQLite: a cluster of one.

import { api } from "../api.js";
import { card, createTable, emptyState, fill, h, setText, show, stat } from "../dom.js";
import { DASH, fmtAgo, fmtDuration, fmtInt, fmtTime, plural } from "../format.js";
import { queueHref } from "./queues.js";

const ROLE_BADGE = { primary: "badge-ok", standby: "badge-warn", spread: "badge-ok" };
const ROLE_HINT = {
  primary: "Holds the lease: serves every client and owns every queue",
  standby: "Waits: relays its clients to the primary and takes over when the lease runs out",
  spread: "Owns the queues rendezvous hashing gives it and forwards the others to their owners",
  gone: "Its record ran out: the others adopt its queues",
};
const EPOCH_HINT = "Fencing epoch: raised each time a broker takes the queue over; " +
  "a write made under an older epoch is refused inside Redis";
const FENCED_HINT = "Writes refused inside Redis because another broker had taken over " +
  "(this broker then stops serving)";

const num = (v) => (v === null || v === undefined || v === "" ? null : Number(v));

/** A label's text, set again (stat() makes it once). */
function relabel(statItem, text) {
  const label = statItem.el.querySelector(".label");
  if (label) label.textContent = text;
}

/** "this broker" marker: text, so it does not depend on colour. */
function selfMark() {
  return h("span", { class: "badge badge-accent", "data-testid": "this-broker" }, "this broker");
}

export function mount(view) {
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" }, h("div", null, h("h1", null, "Cluster"), sub));

  // A broker alone on SQLite: say what a cluster is and how to get one.
  const singleCard = card("A cluster of one", { id: "cluster-single-title", testid: "cluster-single" });
  singleCard.body.className = "";
  singleCard.body.append(emptyState(null,
    "One broker on SQLite: run several brokers on one Redis to get a cluster. One of them, " +
    "the primary, holds a lease and serves; the others wait as standbys and take over " +
    "within owner_lease if it stops. Start each of them with (docs/cluster.md):",
    "minou start --storage redis://127.0.0.1:6379/0"));
  const single = singleCard.el;
  single.hidden = true;

  const sPrimary = stat("Primary", "cluster-primary", { small: true });
  const sBrokers = stat("Brokers", "cluster-brokers");
  const sLease = stat("Owner lease", "owner-lease", { small: true });
  sPrimary.el.classList.add("wide");
  const stats = h("div", { class: "stats" }, sPrimary.el, sBrokers.el, sLease.el);

  let last = null; // the last GET /v1/cluster

  // brokers
  const brokersTable = createTable({
    testid: "brokers-table",
    label: "Brokers",
    sort: { key: "role", dir: "asc" },
    columns: [
      {
        key: "id", label: "Broker", sort: true, class: "nowrap",
        cell: (td, b) => fill(td, [b.id, !!b.self, b.host, b.pid], () => [
          h("strong", { class: "mono", title: [b.host && `host ${b.host}`, b.pid && `pid ${b.pid}`].filter(Boolean).join(", ") || null }, b.id),
          b.self ? [" ", selfMark()] : null]),
      },
      {
        key: "role", label: "Role", sort: true, value: (b) => (b.role === "primary" ? 0 : 1),
        cell: (td, b) => fill(td, b.role, () => h("span", {
          class: `badge ${ROLE_BADGE[b.role] || ""}`, "data-testid": "broker-role", title: ROLE_HINT[b.role] || null,
        }, b.role)),
      },
      {
        key: "addresses", label: "Addresses (native, HTTP)", class: "nowrap",
        cell: (td, b) => fill(td, [b.native || "", b.http || ""], () => h("div", { class: "addresses" },
          h("div", { "data-address": "native" }, h("span", { class: "sr-only" }, "native: "), b.native ? h("code", null, b.native) : DASH),
          h("div", { "data-address": "http" }, h("span", { class: "sr-only" }, "HTTP: "), b.http ? h("code", null, b.http) : DASH))),
      },
      {
        key: "since", label: "Up since", sort: true, class: "nowrap", value: (b) => -(num(b.since) ?? Infinity),
        title: "When the broker started (its record is kept fresh while it is alive)",
        cell: (td, b) => {
          setText(td, b.since ? fmtAgo(num(b.since)) : DASH);
          td.title = b.since ? fmtTime(num(b.since)) : "";
        },
      },
      {
        key: "owned", label: "Queues owned", thClass: "nowrap", num: true, sort: true, value: (b) => owned(b),
        title: "The primary owns every queue; a standby owns none",
        cell: (td, b) => setText(td, last && last.owner_lease == null ? "all" : fmtInt(owned(b))),
      },
      {
        key: "relaying", label: "Relaying", thClass: "nowrap", num: true, sort: true, value: (b) => num(b.relaying) ?? 0,
        title: "Client connections a standby passes on to the primary: now (and in all since it started)",
        cell: (td, b) => {
          td.dataset.testid = "broker-relaying";
          setText(td, b.role === "primary" ? DASH : `${fmtInt(num(b.relaying) ?? 0)} (${fmtInt(num(b.relayed) ?? 0)} in all)`);
        },
      },
    ],
    rowKey: (b) => b.id,
    rowAttrs: (b) => ({ "data-broker": b.id, "data-role": b.role, "data-self": b.self ? "true" : null }),
    empty: () => emptyState(null, "No broker record found in the storage."),
  });
  const brokersCard = card("Brokers", { id: "brokers-title",
    extra: h("span", { class: "hint muted" }, "every broker alive on this storage (its record expires with its lease)") });
  brokersCard.body.className = "";
  brokersCard.body.append(brokersTable.el);

  function owned(b) {
    return last ? (last.queues || []).filter((q) => q.owner === b.id).length : 0;
  }

  // this broker's counters
  const tRenewals = stat("Lease renewals", "lease-renewals");
  const tTakeovers = stat("Takeovers", "takeovers");
  const tFenced = stat("Fenced writes", "fenced-writes");
  tFenced.el.title = FENCED_HINT;
  const meRole = h("span", { class: "hint muted", "data-testid": "this-broker-role" });
  const meCard = card("This broker", { id: "this-broker-title", testid: "this-broker-counters", extra: meRole });
  meCard.body.append(h("div", { class: "stats stats-3" }, tRenewals.el, tTakeovers.el, tFenced.el));

  // queues
  const queuesTable = createTable({
    testid: "cluster-queues-table",
    label: "Queues and their owners",
    sort: { key: "queue", dir: "asc" },
    columns: [
      {
        key: "queue", label: "Queue", sort: true, class: "nowrap",
        cell: (td, q) => fill(td, q.queue, () => h("a", { href: queueHref(q.queue) }, q.queue)),
      },
      {
        key: "epoch", label: "Epoch", num: true, sort: true, title: EPOCH_HINT,
        cell: (td, q) => setText(td, fmtInt(q.epoch)),
      },
      {
        key: "owner", label: "Owner", sort: true, class: "nowrap",
        cell: (td, q) => fill(td, [q.owner, isSelf(q.owner)], () => [
          q.owner ? h("span", { class: "mono" }, q.owner) : DASH, isSelf(q.owner) ? [" ", selfMark()] : null]),
      },
    ],
    rowKey: (q) => q.queue,
    rowAttrs: (q) => ({ "data-queue": q.queue, "data-epoch": q.epoch }),
    empty: () => emptyState(null, "No queue yet: a queue is claimed (epoch 1) when its first message is published."),
  });
  const queuesCard = card("Queues", { id: "cluster-queues-title",
    extra: h("span", { class: "hint muted", title: EPOCH_HINT }, "epoch: raised by every takeover") });
  queuesCard.body.className = "";
  queuesCard.body.append(queuesTable.el);

  function isSelf(id) {
    return !!(last && id && (last.brokers || []).some((b) => b.self && b.id === id));
  }

  // recent events
  const eventsTable = createTable({
    testid: "cluster-events-table",
    label: "Recent takeovers and hand-overs",
    sort: { key: "at", dir: "desc" },
    columns: [
      {
        key: "at", label: "When", class: "nowrap",
        cell: (td, e) => {
          setText(td, fmtAgo(e.at));
          td.title = fmtTime(e.at);
        },
      },
      { key: "by", label: "By", class: "nowrap", cell: (td, e) => fill(td, e.by, () => h("span", { class: "mono" }, e.by)) },
      { key: "what", label: "What", cell: (td, e) => setText(td, e.what) },
      {
        key: "from", label: "From", class: "nowrap",
        cell: (td, e) => fill(td, e.from || "", () => (e.from ? h("span", { class: "mono" }, e.from) : DASH)),
      },
    ],
    rowKey: (e) => e._key,
    rowAttrs: (e) => ({ "data-event": e.what, "data-by": e.by }),
    empty: () => emptyState(null, "No takeover or hand-over recorded yet."),
  });
  const eventsCard = card("Recent events", { id: "cluster-events-title",
    extra: h("span", { class: "hint muted" }, "takeovers and leases given back, newest first") });
  eventsCard.body.className = "";
  eventsCard.body.append(eventsTable.el);

  const clustered = [stats, meCard.el, queuesCard.el, eventsCard.el];
  view.replaceChildren(head, single, stats, brokersCard.el, meCard.el, queuesCard.el, eventsCard.el);

  let alive = true;

  async function refresh() {
    const data = await api("GET", "/v1/cluster");
    if (!alive) return;
    last = data;
    const brokers = data.brokers || [];
    const queues = data.queues || [];
    const events = data.events || [];
    const isCluster = data.owner_lease !== null && data.owner_lease !== undefined;

    show(single, !isCluster);
    for (const el of clustered) show(el, isCluster);
    setText(sub, isCluster
      ? `${plural(brokers.length, "broker")} on ${data.storage} · owner_lease ${fmtDuration(data.owner_lease)}`
      : `one broker on SQLite (${data.storage})`);

    const spread = data.placement === "spread";
    if (spread) {  // no primary: every broker owns a share of the queues
      relabel(sPrimary, "Placement");
      setText(sPrimary.value, "spread");
      setText(sPrimary.extra, "each broker owns the queues rendezvous hashing gives it");
      setText(sBrokers.value, String(brokers.filter((b) => b.alive).length));
      setText(sBrokers.extra, `alive of ${plural(brokers.length, "broker")} recorded`);
      setText(sLease.value, fmtDuration(data.owner_lease));
      setText(sLease.extra, "a dead broker's queues are adopted after this long");
      brokersTable.update(brokers);
      queuesTable.update(queues);
      eventsTable.update(events.map((e, i) => ({
        at: e.at, by: (data.this_broker || {}).member || "", what: `${e.what} ${e.queue}`,
        from: e.to ? `to ${e.to}` : (e.previous || ""), _key: `${e.at}|${e.queue}|${i}`,
      })));
      const me = data.this_broker || {};
      setText(meRole, `${me.member || ""} · spread`);
      relabel(tRenewals, "Queues owned");
      setText(tRenewals.value, fmtInt(me.queues_owned));
      relabel(tTakeovers, "Adopted / handed over");
      setText(tTakeovers.value, `${fmtInt(me.adopted)} / ${fmtInt(me.handed_over)}`);
      setText(tTakeovers.extra, "queues taken from dead or leaving brokers / given to joiners");
      setText(tFenced.value, fmtInt(me.fenced_writes));
      return;
    }
    const primary = brokers.find((b) => b.id === data.primary);
    setText(sPrimary.value, data.primary || "none");
    setText(sPrimary.extra, primary && primary.native ? primary.native : (data.primary ? "" : "the lease is free: a standby takes it"));
    setText(sBrokers.value, String(brokers.length));
    const standbys = brokers.filter((b) => b.role === "standby").length;
    setText(sBrokers.extra, `${data.primary ? 1 : 0} primary · ${plural(standbys, "standby", "standbys")}`);
    setText(sLease.value, isCluster ? fmtDuration(data.owner_lease) : DASH);
    setText(sLease.extra, isCluster ? "a standby takes over after this long" : "");

    brokersTable.update(brokers);
    queuesTable.update(queues);
    const seen = new Map();
    eventsTable.update(events.map((e) => {
      const base = `${e.at}|${e.by}|${e.what}`;
      const n = (seen.get(base) || 0) + 1;
      seen.set(base, n);
      return { ...e, _key: `${base}|${n}` };
    }));

    const me = data.this_broker || {};
    setText(meRole, me.role ? `${me.member || ""} · ${me.role}` +
      (me.role === "primary" && me.primary_since ? ` for ${fmtDuration(Date.now() / 1000 - me.primary_since)}` : "") : "");
    setText(tRenewals.value, fmtInt(me.lease_renewals));
    setText(tTakeovers.value, fmtInt(me.takeovers));
    setText(tTakeovers.extra, "from a primary that stopped renewing");
    setText(tFenced.value, fmtInt(me.fenced_writes));
    const fenced = (me.fenced_writes || 0) > 0;
    tFenced.el.classList.toggle("attention", fenced);
    setText(tFenced.extra, fenced ? "refused: another broker had taken over" : "none refused");
  }

  return {
    title: "Cluster",
    refresh,
    destroy() {
      alive = false;
    },
  };
}
