// #/queues: every queue (endpoint/version, dead-letter queues as _dead/...),
// filterable and sortable, and the reader groups (GET /v1/queues).

import { api, session } from "../api.js";
import { CounterRates } from "../chart.js";
import { card, createTable, emptyState, fill, h, setText } from "../dom.js";
import { DASH, fmtDuration, fmtInt, fmtRate } from "../format.js";

/** A group's patterns as listed: the broker gives the first 100 (MAX_LISTED_NAMES)
 * and their count, so a group of 10,000 says how many more it reads. */
export function patternsText(g) {
  const shown = g.patterns || [];
  const more = (g.patterns_total ?? shown.length) - shown.length;
  return shown.join(", ") + (more > 0 ? ` … (+${fmtInt(more)} more)` : "");
}

const DEAD = "_dead/";
export const WAITING_HINT = "Waiting: stored, not yet delivered (new, requeued or delayed); " +
  "its age is the oldest one's, since it was published";
export const IN_FLIGHT_HINT = "In flight: delivered to a consumer, not yet acked; " +
  "its age is the oldest one's, since it was published";
const OLDEST_WAITING_HINT = "How long the oldest waiting message has waited since it was published";

// Kept across visits.
const state = { filter: "", sort: { key: "queue", dir: "asc" } };

export function queueHref(queue) {
  return `#/queues/${queue}`;
}

export function publishExample() {
  const auth = session.dev ? "" : ' -H "Authorization: Bearer $TOKEN"';
  return `curl -XPOST${auth} ${location.origin}/v1/messages/orders/v1/1 -d '{"hello": "world"}'`;
}

export function mount(view) {
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" }, h("div", null, h("h1", null, "Queues"), sub));

  const filter = h("input", {
    id: "queue-filter", type: "search", class: "filter", "data-testid": "queue-filter",
    placeholder: "Filter by name, e.g. orders", autocomplete: "off", spellcheck: "false",
  });
  filter.value = state.filter;
  const toolbar = h("div", { class: "toolbar" },
    h("label", { for: "queue-filter", class: "sr-only" }, "Filter queues"), filter);

  let last = null;
  const rates = new Map(); // queue -> CounterRates
  const rateNow = new Map(); // queue -> msg/s

  const table = createTable({
    testid: "queues-table",
    label: "Queues",
    sort: state.sort,
    onSort: (sort) => { state.sort = sort; },
    columns: [
      {
        key: "queue", label: "Queue", sort: true, class: "nowrap",
        cell: (td, q) => fill(td, q.queue, () => [
          h("a", { href: queueHref(q.queue), "data-testid": "queue-link" }, q.queue),
          q.queue.startsWith(DEAD) ? [" ", h("span", { class: "badge badge-warn" }, "dead letters")] : null,
        ]),
      },
      { key: "depth", label: "Depth", num: true, sort: true, cell: (td, q) => setText(td, fmtInt(q.depth)) },
      {
        key: "waiting", label: "Waiting", num: true, sort: true, title: WAITING_HINT,
        value: (q) => q.waiting ?? null, cell: (td, q) => setText(td, fmtInt(q.waiting)),
      },
      {
        key: "oldest_waiting", label: "Oldest waiting", num: true, sort: true, title: OLDEST_WAITING_HINT,
        value: (q) => q.oldest_waiting_age_s ?? null,
        cell: (td, q) => setText(td, q.oldest_waiting_age_s == null ? DASH : fmtDuration(q.oldest_waiting_age_s)),
      },
      {
        key: "in_flight", label: "In flight", num: true, sort: true, title: IN_FLIGHT_HINT,
        value: (q) => q.in_flight ?? q.unsettled ?? null, cell: (td, q) => setText(td, fmtInt(q.in_flight ?? q.unsettled)),
      },
      { key: "consumers", label: "Consumers", num: true, sort: true, cell: (td, q) => setText(td, fmtInt(q.consumers)) },
      { key: "listeners", label: "Listeners", num: true, sort: true, cell: (td, q) => setText(td, fmtInt(q.listeners)) },
      {
        key: "rate", label: "Publish rate", num: true, sort: true, value: (q) => rateNow.get(q.queue) ?? 0,
        cell: (td, q) => setText(td, fmtRate(rateNow.get(q.queue))),
      },
      {
        key: "dead", label: "Dead letters", num: true, sort: true, value: (q) => q._dead ?? -1,
        cell: (td, q) => {
          setText(td, q._dead == null ? DASH : fmtInt(q._dead));
          td.classList.toggle("warn-text", (q._dead || 0) > 0);
        },
      },
    ],
    rowKey: (q) => q.queue,
    rowAttrs: (q) => ({ "data-queue": q.queue }),
    empty: () => (last && last.queues.length
      ? emptyState(null, `No queue matches “${state.filter}”.`)
      : emptyState("No queues yet",
        "A queue appears when the first message is published to one of its channels. Try:",
        publishExample())),
  });
  const queuesCard = card(null);
  queuesCard.body.className = "";
  queuesCard.body.append(table.el);

  const groupsTable = createTable({
    testid: "groups-table",
    label: "Reader groups",
    sort: { key: "group", dir: "asc" },
    columns: [
      { key: "group", label: "Group", sort: true, cell: (td, g) => fill(td, g.group, () => h("code", null, g.group)) },
      { key: "kind", label: "Kind", sort: true, cell: (td, g) => setText(td, g.kind) },
      { key: "patterns", label: "Patterns", class: "wrap", cell: (td, g) => setText(td, patternsText(g)) },
      { key: "members", label: "Members", num: true, sort: true, cell: (td, g) => setText(td, fmtInt(g.members)) },
      {
        key: "waiting", label: "Waiting", num: true, sort: true, title: WAITING_HINT,
        value: (g) => g.waiting ?? null, cell: (td, g) => setText(td, fmtInt(g.waiting)),
      },
      {
        key: "in_flight", label: "In flight", num: true, sort: true, title: IN_FLIGHT_HINT,
        value: (g) => g.in_flight ?? g.unsettled ?? null, cell: (td, g) => setText(td, fmtInt(g.in_flight ?? g.unsettled)),
      },
      { key: "lag", label: "Lag", num: true, sort: true, cell: (td, g) => setText(td, fmtInt(g.lag)) },
      { key: "delivered", label: "Delivered", num: true, sort: true, cell: (td, g) => setText(td, fmtInt(g.delivered)) },
      { key: "acked", label: "Acked", num: true, sort: true, cell: (td, g) => setText(td, fmtInt(g.acked)) },
    ],
    rowKey: (g) => g.group,
    rowAttrs: (g) => ({ "data-group": g.group }),
    empty: () => emptyState(null, "No reader group yet: one is made when a consumer or listener subscribes."),
  });
  const groupsCard = card("Reader groups", { id: "groups-title",
    extra: h("span", { class: "hint muted" }, "lag: messages not yet handed to the group") });
  groupsCard.body.className = "";
  groupsCard.body.append(groupsTable.el);

  view.replaceChildren(head, toolbar, queuesCard.el, groupsCard.el);

  function render() {
    if (!last) return;
    const needle = state.filter.trim().toLowerCase();
    const shown = last.queues.filter((q) => !needle || q.queue.toLowerCase().includes(needle));
    table.update(shown);
    const n = last.queues.length;
    const dead = last.queues.filter((q) => q.queue.startsWith(DEAD)).length;
    setText(sub, `${n} queue${n === 1 ? "" : "s"}` + (dead ? ` (${dead} dead-letter)` : "") +
      ` · ${last.groups.length} reader group${last.groups.length === 1 ? "" : "s"}` +
      (needle ? ` · ${shown.length} shown` : ""));
  }

  filter.addEventListener("input", () => {
    state.filter = filter.value;
    render();
  });

  let alive = true;

  async function refresh() {
    const data = await api("GET", "/v1/queues");
    if (!alive) return;
    const queues = data.queues || [];
    const depthOf = new Map(queues.map((q) => [q.queue, q.depth]));
    const t = performance.now() / 1000;
    for (const q of queues) {
      q._dead = q.queue.startsWith(DEAD) ? null : (depthOf.get(DEAD + q.queue) ?? 0);
      let r = rates.get(q.queue);
      if (!r) rates.set(q.queue, (r = new CounterRates()));
      const delta = r.sample(t, { p: q.published });
      // First sample: the broker's own recent average.
      rateNow.set(q.queue, delta ? delta.p : (q.rates ? q.rates.published : null));
    }
    last = { queues, groups: data.groups || [] };
    render();
    groupsTable.update(last.groups);
  }

  return {
    title: "Queues",
    refresh,
    destroy() {
      alive = false;
    },
  };
}
