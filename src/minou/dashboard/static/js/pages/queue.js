// #/queues/<endpoint>/<version> (and #/queues/_dead/<endpoint>/<version>):
// one queue: diagnosis, numbers, options, live rates, dead letters, channels,
// a message browser and the reader groups, with purge / requeue actions.

import { api, channelId, queuePath } from "../api.js";
import { legend, loadHistory, RateChart, RateSeries } from "../chart.js";
import { card, confirmAction, createTable, emptyState, fill, h, scrollable, setAttr, setText, show, stat, toast } from "../dom.js";
import { DASH, fmtAgo, fmtBytes, fmtDuration, fmtInt, fmtTime, plural } from "../format.js";
import { IN_FLIGHT_HINT, patternsText, publishExample, WAITING_HINT } from "./queues.js";

const DEAD = "_dead/";
const PAGE_SIZE = 20;
const MAX_CHANNEL_BUTTONS = 200;
const MAX_PAYLOAD_CHARS = 100_000;

// Chart history per queue, kept across visits (a few queues); each visit starts again
// from the broker's last ten minutes of the queue.
const histories = new Map();

function historyFor(queue) {
  let s = histories.get(queue);
  if (!s) {
    if (histories.size >= 20) histories.delete(histories.keys().next().value);
    s = new RateSeries();
    histories.set(queue, s);
  }
  return s;
}

const OPTIONS = [
  ["prefetch", "Prefetch", (v) => fmtInt(v)],
  ["ttl", "TTL", (v) => (v == null ? "none" : fmtDuration(v))],
  ["max_items", "Max items", (v) => (v == null ? "unlimited" : fmtInt(v))],
  ["overflow", "Overflow", (v) => v ?? DASH],
  ["requeue_limit", "Requeue limit", (v) => fmtInt(v)],
  ["dead_letter", "Dead letter", (v) => (v == null ? DASH : v ? "yes" : "no (dropped)")],
  ["retention", "Retention", (v) => (v == null ? "none" : fmtDuration(v))],
  ["schema", "Schema", (v) => v ?? "none"],
  ["durability", "Durability", (v, o) => (v === "interval" ? `interval (fsync within ${fmtInt(o.sync_interval_ms)} ms)` : v ?? DASH)],
  ["expire_idle", "Expires when idle", (v) => (v == null ? "never" : `after ${fmtDuration(v)}`)],
];

/** A payload as text: JSON pretty-printed, raw bytes as "N raw bytes" + base64. */
function payloadView(m) {
  if (m.payload_base64 != null) {
    const n = m.size ?? Math.floor((m.payload_base64.length * 3) / 4) - (m.payload_base64.match(/=*$/)[0].length);
    return [
      h("div", { class: "raw-label" }, `${plural(n, "raw byte")} (base64)`),
      scrollable(h("pre", { class: "raw", "data-testid": "message-payload" }, truncate(m.payload_base64)), `message ${m.seq} payload`),
    ];
  }
  return scrollable(h("pre", { "data-testid": "message-payload" }, truncate(JSON.stringify(m.payload, null, 2))), `message ${m.seq} payload`);
}

/** The first bytes of a payload, on one line. */
function preview(m) {
  const text = m.payload_base64 != null ? `(${plural(m.size ?? 0, "raw byte")}) ${m.payload_base64}`
    : JSON.stringify(m.payload);
  return text.length > 120 ? text.slice(0, 120) + "…" : text;
}

function truncate(text) {
  if (text.length <= MAX_PAYLOAD_CHARS) return text;
  return text.slice(0, MAX_PAYLOAD_CHARS) + `\n… (${fmtInt(text.length - MAX_PAYLOAD_CHARS)} more characters)`;
}

function field(label, value, attrs = {}) {
  return h("span", { class: "field", ...attrs }, h("span", { class: "k" }, label), h("span", { class: "v" }, value));
}

export function mount(view, params, ctx) {
  const base = `${params.endpoint}/${params.version}`;
  const isDead = params.dead;
  const queue = isDead ? DEAD + base : base;
  const qp = queuePath(queue);
  const deadQueue = DEAD + base;

  // ------------------------------------------------------------ layout
  const purgeBtn = h("button", { type: "button", class: "btn btn-danger", "data-testid": "purge", "aria-label": `Purge queue ${queue}` }, "Purge queue");
  const head = h("div", { class: "page-head" },
    h("div", null,
      h("div", { class: "crumbs muted" }, h("a", { href: "#/queues" }, "Queues"), " / ",
        isDead ? h("a", { href: `#/queues/${base}` }, base) : null, isDead ? " / " : null),
      h("h1", { "data-testid": "queue-title" }, queue),
      h("div", { class: "sub muted" })),
    isDead ? null : h("div", { class: "btn-row" }, purgeBtn));
  const sub = head.querySelector(".sub");

  const diagnosis = h("p", { class: "diagnosis", "data-testid": "diagnosis", role: "status", hidden: true });
  const notFound = h("div", { class: "card", hidden: true },
    emptyState(`No queue ${queue}`,
      "It has no channel (yet): it appears when a message is published to it. This page updates by itself.",
      isDead ? null : publishExample().replace("orders/v1", base)));

  const sDepth = stat("Depth", "q-depth");
  // Two kinds of unsettled messages, each with the age of its own oldest.
  const sWaiting = stat("Waiting", "q-waiting");
  const sInFlight = stat("In flight", "q-in-flight");
  sDepth.el.title = "Depth: messages stored (waiting, in flight, or settled and kept by retention)";
  sWaiting.el.title = WAITING_HINT;
  sInFlight.el.title = IN_FLIGHT_HINT;
  sWaiting.extra.dataset.testid = "q-oldest-waiting";
  sInFlight.extra.dataset.testid = "q-oldest-in-flight";
  const sConsumers = stat("Consumers", "q-consumers");
  const sListeners = stat("Listeners", "q-listeners");
  const sPublished = stat("Published", "q-published");
  const stats = h("div", { class: "stats" }, sDepth.el, sWaiting.el, sInFlight.el, sConsumers.el, sListeners.el, sPublished.el);

  // chart
  const history = historyFor(queue);
  const chartCard = card("Rates", { id: "queue-rates-title",
    extra: h("span", { class: "legend-inline", title: "messages per second" }, ...legend()) });
  const chartBox = h("div", { class: "chart", "data-testid": "queue-chart", role: "img",
    "aria-label": `Publish, deliver and ack rates of ${queue}` });
  chartCard.body.className = "";
  chartCard.body.append(chartBox);

  // options
  const optionsCard = card("Options", { id: "queue-options-title" });
  const optionsList = h("dl", { class: "kv", "data-testid": "options" });
  const optionEls = {};
  for (const [key, label] of OPTIONS) {
    optionEls[key] = h("dd", { "data-option": key }, DASH);
    optionsList.append(h("dt", null, label), optionEls[key]);
  }
  optionsCard.body.append(optionsList);

  // dead letters
  const deadCount = h("span", { "data-testid": "dead-count", class: "tabular" }, "0");
  const requeueBtn = h("button", { type: "button", class: "btn", "data-testid": "dead-requeue", "aria-label": `Requeue dead letters of ${base}` }, "Requeue dead letters");
  const deadPurgeBtn = h("button", { type: "button", class: "btn btn-danger", "data-testid": "dead-purge", "aria-label": `Purge dead letters of ${base}` }, "Purge dead letters");
  const deadLink = h("a", { href: `#/queues/${deadQueue}` }, isDead ? "" : "browse them");
  const deadCard = card("Dead letters", { id: "dead-title", testid: "dead-letters" });
  deadCard.body.append(
    h("p", null,
      h("strong", { class: "big" }, deadCount), " ",
      isDead ? `dead letter(s) of ${base}, moved here after too many redeliveries or on expiry.`
        : h("span", null, `in `, h("code", null, deadQueue), h("span", { class: "dead-link" }, " (", deadLink, ")"))),
    h("div", { class: "btn-row" }, requeueBtn, deadPurgeBtn));

  // channels
  const channelsCard = card("Channels", { id: "channels-title",
    extra: h("span", { class: "hint muted" }, "select one to browse its messages") });
  const channelsBox = h("div", { class: "channels", "data-testid": "channels", role: "group", "aria-label": "Channels" });
  const channelsMore = h("p", { class: "muted", hidden: true });
  channelsCard.body.append(channelsBox, channelsMore);

  // messages
  // The pager twice, above and below the list: one state, two sets of buttons.
  const pagers = ["", "-bottom"].map((suffix) => ({
    prev: h("button", { type: "button", class: "btn btn-sm", "data-testid": `messages-prev${suffix}`, disabled: true }, "← Previous"),
    next: h("button", { type: "button", class: "btn btn-sm", "data-testid": `messages-next${suffix}`, disabled: true }, "Next →"),
    info: h("span", { class: "info", "aria-hidden": suffix ? "true" : null }),
  }));
  const pagerEl = (p, label) => h("nav", { class: "pager", "aria-label": label }, p.prev, p.info, p.next);
  const msgTitle = h("h2", { id: "messages-title" }, "Messages");
  const msgList = h("div", { class: "messages" });
  const msgNote = h("div", { hidden: true });
  const messagesCard = h("section", { class: "card", "data-testid": "messages", "aria-labelledby": "messages-title" },
    h("div", { class: "card-head" }, msgTitle, pagerEl(pagers[0], "Message pages")),
    h("div", { class: "card-body" }, msgNote, msgList,
      h("div", { class: "pager-bottom" }, pagerEl(pagers[1], "Message pages (bottom)"))));

  // groups
  const groupRates = new Map();
  const groupsTable = createTable({
    testid: "queue-groups-table",
    label: "Reader groups",
    sort: { key: "group", dir: "asc" },
    columns: [
      { key: "group", label: "Group", sort: true, cell: (td, g) => fill(td, g.group, () => h("code", null, g.group)) },
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
      { key: "delivered", label: "Delivered", num: true, cell: (td, g) => setText(td, fmtInt(g.delivered)) },
      { key: "acked", label: "Acked", num: true, cell: (td, g) => setText(td, fmtInt(g.acked)) },
      {
        key: "rates", label: "Deliver / ack", num: true,
        cell: (td, g) => {
          const r = groupRates.get(g.group);
          setText(td, r ? `${fmtRateShort(r.d)} / ${fmtRateShort(r.a)}` : DASH);
        },
      },
      {
        key: "actions", label: "", class: "actions",
        cell: (td, g) => fill(td, g.group, () => h("button", {
          type: "button", class: "btn btn-sm btn-danger", "data-testid": "group-forget",
          "aria-label": `Forget group ${g.group}`, onclick: () => forgetGroup(g),
        }, "Forget")),
      },
    ],
    rowKey: (g) => g.group,
    rowAttrs: (g) => ({ "data-group": g.group }),
    empty: () => emptyState(null, "No reader group reads this queue yet."),
  });
  const groupsCard = card("Reader groups", { id: "queue-groups-title" });
  groupsCard.body.className = "";
  groupsCard.body.append(groupsTable.el);

  const content = h("div", { class: "grid" },
    stats,
    h("div", { class: "grid grid-2" }, chartCard.el, optionsCard.el),
    deadCard.el, groupsCard.el, channelsCard.el, messagesCard);
  view.replaceChildren(head, diagnosis, notFound, content);

  history.gap();
  const chart = new RateChart(chartBox, history);

  // ------------------------------------------------------------ state
  let alive = true;
  let detail = null;
  const browse = { channel: null, from: 0, stack: [], req: 0 };
  const groupCounters = new Map(); // group -> {t, d, a}

  function fmtRateShort(v) {
    if (v == null) return DASH;
    return v < 10 ? String(Math.round(v * 10) / 10) + "/s" : Math.round(v) + "/s";
  }

  function selectChannel(id) {
    if (browse.channel === id) return;
    browse.channel = id;
    browse.from = 0;
    browse.stack = [];
    browse.req++;
    msgList.replaceChildren();
    renderChannels();
    ctx.refreshNow();
  }

  for (const p of pagers) {
    p.prev.addEventListener("click", () => {
      if (!browse.stack.length) return;
      browse.from = browse.stack.pop();
      browse.req++;
      ctx.refreshNow();
    });
    p.next.addEventListener("click", () => {
      if (browse.next == null) return;
      browse.stack.push(browse.from);
      browse.from = browse.next;
      browse.req++;
      ctx.refreshNow();
    });
  }

  function setPager(prevOff, nextOff, text) {
    for (const p of pagers) {
      p.prev.disabled = prevOff;
      p.next.disabled = nextOff;
      setText(p.info, text);
    }
  }

  function renderChannels() {
    const channels = detail ? detail.channels || [] : [];
    const shown = channels.slice(0, MAX_CHANNEL_BUTTONS);
    fill(channelsBox, { ids: shown.map((c) => c.channel) }, () => shown.map((c) => {
      const id = channelId(c.channel, queue);
      return h("button", {
        type: "button", "data-testid": "channel", "data-channel": id,
        onclick: () => selectChannel(id),
      }, h("span", { class: "id" }, id), h("span", { class: "count" }));
    }));
    for (const btn of channelsBox.children) {
      const c = channels.find((x) => channelId(x.channel, queue) === btn.dataset.channel);
      setAttr(btn, "aria-pressed", btn.dataset.channel === browse.channel ? "true" : "false");
      if (c) {
        setText(btn.querySelector(".count"), fmtInt(c.depth));
        btn.title = `${c.channel}: depth ${c.depth}, in flight ${c.unsettled}, seq ${c.first_seq}–${c.next_seq - 1}` +
          (c.readers && c.readers.length ? `, read by ${c.readers.join(", ")}` : "") +
          ((c.readers_total ?? 0) > (c.readers || []).length ? ` and ${c.readers_total - c.readers.length} more` : "");
      }
    }
    show(channelsMore, channels.length > shown.length);
    setText(channelsMore, `Showing ${shown.length} of ${fmtInt(channels.length)} channels.`);
    if (!channels.length) channelsBox.replaceChildren(h("span", { class: "muted" }, "No channel."));
  }

  /** One message: a line (seq, id, age, attempts, size, the payload's first bytes; on
   * a dead-letter queue its reason and source channel too) that opens in place on the
   * message's headers, payload and actions. */
  function messageRow(m, key, now) {
    const hdrs = m.headers || {};
    const headers = Object.entries(hdrs);
    const details = [
      field("id", h("span", { class: "mono" }, m.id), { "data-field": "id-full" }),
      field("published", fmtTime(m.published_at)),
      m.priority ? field("priority", String(m.priority), { "data-field": "priority" }) : null,
      m.key != null ? field("key", h("span", { class: "mono" }, m.key), { "data-field": "key" }) : null,
      m.expires_at ? field("expires", fmtAgo(m.expires_at, now), { title: fmtTime(m.expires_at) }) : null,
      m.deliver_at && m.deliver_at > now ? field("delayed until", fmtTime(m.deliver_at)) : null,
      isDead && hdrs["x-dead-detail"] ? field("why", hdrs["x-dead-detail"], { "data-field": "why" }) : null,
    ];
    const del = h("button", { type: "button", class: "btn btn-sm btn-danger", "data-testid": "message-delete",
      "aria-label": `Delete message ${m.seq}` }, "Delete");
    del.addEventListener("click", () => run(del, {
      title: `Delete message ${m.seq} of ${queue}/${browse.channel}?`,
      text: "It is removed for every reader. This cannot be undone.",
      yes: "Delete", method: "DELETE",
      path: `/v1/queues/${qp}/${encodeURIComponent(browse.channel)}/messages/${m.seq}`,
      done: (r) => (r.messages ? `deleted message ${m.seq}` : `message ${m.seq} was already gone`),
    }));
    let requeue = null;
    if (isDead) {
      requeue = h("button", { type: "button", class: "btn btn-sm", "data-testid": "message-requeue",
        "aria-label": `Requeue message ${m.seq}` }, "Requeue");
      requeue.addEventListener("click", () => run(requeue, {
        title: `Requeue message ${m.seq}?`,
        text: `It goes back to ${hdrs["x-original-channel"] || base} and is delivered again.`,
        yes: "Requeue",
        path: `/v1/dead/${queuePath(base)}/requeue?channel=${encodeURIComponent(browse.channel)}&seqs=${m.seq}`,
        done: (r) => (r.messages ? `requeued message ${m.seq}` : `message ${m.seq} was not requeued (gone, or held by a reader)`),
      }));
    }
    return h("details", { class: "message", "data-testid": "message-row", "data-key": key, "data-seq": m.seq, "data-id": m.id },
      h("summary", { class: "message-line" + (isDead ? " dead" : "") },
        h("span", { class: "seq", "data-field": "seq" }, `#${m.seq}`),
        h("span", { class: "mono id", "data-field": "id", title: m.id }, m.id),
        h("span", { class: "age", "data-field": "age", title: fmtTime(m.published_at) }),
        h("span", { class: "attempts", "data-field": "attempts" }),
        h("span", { class: "size", "data-field": "size" }, fmtBytes(m.size)),
        isDead ? h("span", { class: "badge badge-warn reason", "data-field": "reason", title: hdrs["x-dead-detail"] || "" }, hdrs["x-dead-reason"] || DASH) : null,
        isDead ? h("span", { class: "mono source", "data-field": "source" }, hdrs["x-original-channel"] || DASH) : null,
        h("span", { class: "mono preview", "data-field": "preview" }, preview(m))),
      h("div", { class: "message-body" },
        h("div", { class: "message-fields" }, ...details),
        h("div", { class: "message-headers", "data-field": "headers" },
          headers.length
            ? headers.map(([k, v]) => h("span", { class: "badge", "data-header": k }, `${k}: ${v}`))
            : h("span", { class: "muted small" }, "no headers")),
        payloadView(m),
        h("div", { class: "btn-row message-actions" }, requeue, del)));
  }

  function renderMessages(res, depth) {
    const now = Date.now() / 1000;
    const msgs = res.messages || [];
    const keep = new Set();
    const rows = new Map(Array.from(msgList.children).map((el) => [el.dataset.key, el]));
    const order = [];
    for (const m of msgs) {
      const key = `${m.seq}:${m.id}`;
      keep.add(key);
      let row = rows.get(key);
      if (!row) row = messageRow(m, key, now);
      setText(row.querySelector("[data-field=age]"), fmtAgo(m.published_at, now));
      setText(row.querySelector("[data-field=attempts]"), plural(m.attempts ?? 0, "attempt"));
      order.push(row);
    }
    for (const [key, el] of rows) if (!keep.has(key)) el.remove();
    order.forEach((row, i) => {
      if (msgList.children[i] !== row) msgList.insertBefore(row, msgList.children[i] || null);
    });

    browse.next = res.next_seq < res.end && msgs.length ? res.next_seq : null;
    const stored = depth ?? Math.max(0, res.end - res.first_seq);
    setPager(browse.stack.length === 0, browse.next == null, msgs.length
      ? `seq ${msgs[0].seq}–${msgs[msgs.length - 1].seq} · ${fmtInt(stored)} stored`
      : `${fmtInt(stored)} stored`);
    if (!msgs.length) {
      fill(msgNote, "empty", () => emptyState(null, browse.stack.length
        ? "No more messages on this page: go back."
        : "No message stored in this channel (settled messages are removed unless the queue has retention)."));
      msgNote.hidden = false;
    } else {
      msgNote.hidden = true;
    }
  }

  function messagesError(exc) {
    msgList.replaceChildren();
    fill(msgNote, `err:${exc.message}`, () => h("p", { class: "form-error" }, `Could not browse the messages: ${exc.message}`));
    msgNote.hidden = false;
    setPager(browse.stack.length === 0, true, "");
  }

  // ------------------------------------------------------------ refresh
  let seeded = false;

  async function refresh() {
    if (!seeded) {
      seeded = true;
      if (await loadHistory(history, queue) && alive) chart.update();
    }
    const req = browse.req;
    const [detailRes, listRes] = await Promise.allSettled([
      api("GET", `/v1/queues/${qp}`),
      api("GET", "/v1/queues"),
    ]);
    if (!alive) return;
    if (detailRes.status === "rejected") {
      if (detailRes.reason.status === 404) {
        detail = null;
        show(notFound, true);
        show(content, false);
        show(diagnosis, false);
        purgeBtn.hidden = true;
        setText(sub, "");
        return;
      }
      throw detailRes.reason;
    }
    if (listRes.status === "rejected") throw listRes.reason;
    detail = detailRes.value;
    // Channels in natural order (7 before 42), as listed; the browser defaults to the first.
    const naturally = new Intl.Collator("en", { numeric: true });
    (detail.channels || []).sort((a, b) => naturally.compare(channelId(a.channel, queue), channelId(b.channel, queue)));
    show(notFound, false);
    show(content, true);
    purgeBtn.hidden = false;

    const d = detail;
    const t = performance.now() / 1000;
    setText(sub, `${plural(d.channels ? d.channels.length : 0, "channel")} · ` +
      `${fmtInt(d.dropped ?? 0)} dropped · ${fmtInt(d.expired ?? 0)} expired`);
    if (d.diagnosis) setText(diagnosis, d.diagnosis);
    show(diagnosis, !!d.diagnosis);

    setText(sDepth.value, String(d.depth ?? 0));
    setText(sWaiting.value, String(d.waiting ?? 0));
    setText(sWaiting.extra, d.oldest_waiting_age_s == null ? "" : `oldest ${fmtDuration(d.oldest_waiting_age_s)}`);
    setText(sInFlight.value, String(d.in_flight ?? d.unsettled ?? 0));
    setText(sInFlight.extra, d.oldest_in_flight_age_s == null ? "" : `oldest ${fmtDuration(d.oldest_in_flight_age_s)}`);
    setText(sConsumers.value, String(d.consumers ?? 0));
    setText(sListeners.value, String(d.listeners ?? 0));
    setText(sPublished.value, String(d.published ?? 0));
    for (const [key, , fmt] of OPTIONS) setText(optionEls[key], fmt(d.options ? d.options[key] : null, d.options || {}));

    // dead letters: the depth of _dead/<queue> (0 when it does not exist)
    const queues = listRes.value.queues || [];
    const dq = queues.find((q) => q.queue === deadQueue);
    const dead = dq ? dq.depth : 0;
    setText(deadCount, String(dead));
    deadCard.el.classList.toggle("has-dead", dead > 0);
    for (const b of [requeueBtn, deadPurgeBtn]) { // nothing to act on: say so
      if (b.dataset.busy) continue;
      b.disabled = dead === 0;
      b.title = dead === 0 ? "No dead letters" : "";
    }
    if (!isDead) {
      show(deadCard.el.querySelector(".dead-link"), !!dq);
    }

    // rates: publish from the counter; deliver/ack from counters when the API has
    // them, otherwise its own recent averages.
    const api_rates = d.rates || {};
    const counters = { p: d.published };
    if (typeof d.delivered === "number") counters.d = d.delivered;
    if (typeof d.acked === "number") counters.a = d.acked;
    const delta = history.rates.sample(t, counters);
    const pick = (k, name) => (delta && delta[k] !== undefined ? delta[k] : api_rates[name] ?? null);
    history.push([pick("p", "published"), pick("d", "delivered"), pick("a", "acked")]);
    chart.update();

    for (const g of d.groups || []) {
      const prev = groupCounters.get(g.group);
      groupCounters.set(g.group, { t, d: g.delivered, a: g.acked });
      if (prev && t > prev.t) {
        groupRates.set(g.group, {
          d: g.delivered >= prev.d ? (g.delivered - prev.d) / (t - prev.t) : null,
          a: g.acked >= prev.a ? (g.acked - prev.a) / (t - prev.t) : null,
        });
      }
    }
    groupsTable.update(d.groups || []);

    // channels and the message browser
    const ids = (d.channels || []).map((c) => channelId(c.channel, queue));
    if (!browse.channel || !ids.includes(browse.channel)) {
      browse.channel = ids[0] || null;
      browse.from = 0;
      browse.stack = [];
      msgList.replaceChildren();
    }
    renderChannels();
    if (!browse.channel) {
      setText(msgTitle, "Messages");
      msgList.replaceChildren();
      msgNote.hidden = true;
      return;
    }
    setText(msgTitle, `Messages in ${queue}/${browse.channel}`);
    if (req !== browse.req) return; // the page or channel changed meanwhile: the next poll follows
    try {
      const res = await api("GET", `/v1/queues/${qp}/${encodeURIComponent(browse.channel)}/messages`,
        { query: { from_seq: browse.from || null, limit: PAGE_SIZE } });
      if (!alive || req !== browse.req) return;
      const ch = (d.channels || []).find((c) => channelId(c.channel, queue) === browse.channel);
      renderMessages(res, ch ? ch.depth : null);
    } catch (exc) {
      if (!alive || req !== browse.req) return;
      if (exc.status === 0 || exc.status === 401) throw exc;
      messagesError(exc);
    }
  }

  // ------------------------------------------------------------ actions
  async function run(button, { title, text, yes, method = "POST", path, done }) {
    if (!(await confirmAction({ title, text, yes }))) return;
    button.disabled = true;
    button.dataset.busy = "1";
    try {
      const res = await api(method, path);
      toast(done(res || {}));
    } catch (exc) {
      toast(exc.message, { error: true });
    } finally {
      delete button.dataset.busy;
      button.disabled = false;
      ctx.refreshNow();
    }
  }

  purgeBtn.addEventListener("click", () => run(purgeBtn, {
    title: `Purge ${queue}?`,
    text: `Every stored message of its ${plural(detail?.channels?.length ?? 0, "channel")} is removed ` +
      `(depth ${fmtInt(detail?.depth ?? 0)}). Reader groups go on from the end. This cannot be undone.`,
    yes: "Purge",
    path: `/v1/queues/${qp}/purge`,
    done: (r) => `purged ${plural(r.messages ?? 0, "message")}`,
  }));

  requeueBtn.addEventListener("click", () => run(requeueBtn, {
    title: `Requeue the dead letters of ${base}?`,
    text: `The messages of ${deadQueue} (${deadCount.textContent} now) go back to their channels in ${base} ` +
      "and are delivered again.",
    yes: "Requeue",
    path: `/v1/dead/${queuePath(base)}/requeue`,
    done: (r) => `requeued ${plural(r.messages ?? 0, "message")}`,
  }));

  deadPurgeBtn.addEventListener("click", () => run(deadPurgeBtn, {
    title: `Purge the dead letters of ${base}?`,
    text: `The ${deadCount.textContent} message(s) of ${deadQueue} are removed. This cannot be undone.`,
    yes: "Purge",
    path: `/v1/dead/${queuePath(base)}/purge`,
    done: (r) => `purged ${plural(r.messages ?? 0, "dead letter")}`,
  }));

  function forgetGroup(g) {
    const button = groupsTable.table.querySelector(`tr[data-group="${CSS.escape(g.group)}"] [data-testid=group-forget]`);
    run(button || purgeBtn, {
      title: `Forget the reader group ${g.group}?`,
      text: `Its position and unsettled deliveries on every channel are dropped` +
        (g.members ? ` (${plural(g.members, "member")} connected: the broker refuses unless they leave).` : "."),
      yes: "Forget",
      method: "DELETE",
      path: `/v1/groups/${encodeURIComponent(g.group)}`,
      done: () => `forgot group ${g.group}`,
    });
  }

  return {
    title: queue,
    refresh,
    destroy() {
      alive = false;
      chart.destroy();
    },
  };
}
