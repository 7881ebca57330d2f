// #/overview: identity, uptime, storage, connections, live rates, totals,
// refusals and authentication failures (GET /v1/status).

import { api } from "../api.js";
import { legend, loadHistory, RATE_SERIES, RateChart, RateSeries } from "../chart.js";
import { card, createTable, emptyState, fill, h, setText, stat } from "../dom.js";
import { fmtBytes, fmtDuration, fmtInt, fmtRate } from "../format.js";

// Kept across visits; each visit starts again from the broker's last ten minutes.
const history = new RateSeries();

const OTHER_COUNTERS = [
  ["redelivered", "Redelivered"],
  ["nacked", "Nacked"],
  ["dead_lettered", "Dead-lettered"],
  ["requeued", "Requeued (dead letters moved back)"],
  ["expired", "Expired"],
  ["dropped", "Dropped"],
  ["duplicates", "Duplicates"],
  ["lease_expired", "Leases expired"],
];

const REASON_HINTS = {
  not_authenticated: "no or bad credentials",
  not_authorized: "a rule or admin check refused it",
  pending_approval: "a client waiting for approval",
  schema_mismatch: "payload did not match the schema",
  queue_full: "max_items reached (overflow = refuse)",
  too_large: "over max_message_size",
  invalid_channel: "malformed channel name",
  invalid_payload: "payload is not valid JSON",
};

export function mount(view) {
  const head = h("div", { class: "page-head" },
    h("div", null, h("h1", null, "Overview"), h("div", { class: "sub muted" })));
  const sub = head.querySelector(".sub");

  const sBroker = stat("Broker", "broker-id", { small: true });
  const sVersion = stat("Version", "version", { small: true });
  const sUptime = stat("Uptime", "uptime", { small: true });
  const sStorage = stat("Storage", "storage", { small: true });
  const sConns = stat("Connections", "connections");
  const sChannels = stat("Channels", "channels");
  const stats = h("div", { class: "stats" },
    sBroker.el, sVersion.el, sUptime.el, sStorage.el, sConns.el, sChannels.el);

  // live rates
  const legendNow = h("div", { class: "legend-inline", "aria-live": "off" });
  const chartCard = card("Message rates", { extra: legendNow, id: "rates-title" });
  const chartBox = h("div", { class: "chart", "data-testid": "rates-chart", role: "img",
    "aria-label": "Publish, deliver and ack rates per second" });
  chartCard.body.className = "";
  chartCard.body.append(chartBox);

  // totals
  const totals = card("Totals since start", { id: "totals-title" });
  const tPub = stat("Published", "total-published");
  const tDel = stat("Delivered", "total-delivered");
  const tAck = stat("Acked", "total-acked");
  const others = h("dl", { class: "kv", "data-testid": "counters" });
  const otherEls = {};
  for (const [key, label] of OTHER_COUNTERS) {
    otherEls[key] = h("dd", { "data-counter": key }, "—");
    others.append(h("dt", null, label), otherEls[key]);
  }
  otherEls.publisher_pauses = h("dd", { "data-counter": "publisher_pauses" }, "—");
  otherEls.slow_consumers_cut = h("dd", { "data-counter": "slow_consumers_cut" }, "—");
  others.append(h("dt", null, "Publisher pauses"), otherEls.publisher_pauses,
    h("dt", null, "Slow consumers cut"), otherEls.slow_consumers_cut);
  totals.body.append(h("div", { class: "stats stats-3 spaced" }, tPub.el, tDel.el, tAck.el), others);

  // refusals and auth failures
  const refusals = card("Errors and refusals", { id: "refusals-title",
    extra: h("span", { class: "hint muted" }, "requests refused, by reason") });
  const refusalsBox = h("div", { "data-testid": "refusals" });
  const refusalsTable = createTable({
    testid: "refusals-table",
    label: "Refusals by reason",
    columns: [
      { key: "reason", label: "Reason", cell: (td, r) => fill(td, r.reason, () => [
        h("code", null, r.reason), REASON_HINTS[r.reason] ? h("div", { class: "muted" }, REASON_HINTS[r.reason]) : null]) },
      { key: "count", label: "Count", num: true, cell: (td, r) => setText(td, fmtInt(r.count)) },
    ],
    rowKey: (r) => r.reason,
    rowAttrs: (r) => ({ "data-reason": r.reason }),
    sort: { key: "count", dir: "desc" },
  });
  const refusalsNone = h("p", { class: "muted", "data-testid": "refusals-none" }, "none: no request was refused since the broker started");
  refusalsBox.append(refusalsTable.el, refusalsNone);
  refusals.body.append(refusalsBox);

  const failuresBox = h("div", { "data-testid": "auth-failures" });
  const failuresTable = createTable({
    testid: "auth-failures-table",
    label: "Authentication failures",
    columns: [
      { key: "why", label: "Authentication failure", cell: (td, r) => fill(td, r.why, () => h("code", null, r.why)) },
      { key: "count", label: "Count", num: true, cell: (td, r) => setText(td, fmtInt(r.count)) },
    ],
    rowKey: (r) => r.why,
    rowAttrs: (r) => ({ "data-why": r.why }),
    sort: { key: "count", dir: "desc" },
  });
  const failuresNone = h("p", { class: "muted" }, "none: no authentication failed");
  failuresBox.append(h("h3", { class: "subhead" }, "Authentication failures"), failuresTable.el, failuresNone);
  refusals.body.append(failuresBox);

  view.replaceChildren(head, stats, chartCard.el, h("div", { class: "grid grid-2" }, totals.el, refusals.el));

  history.gap();
  const chart = new RateChart(chartBox, history);
  const legendItems = RATE_SERIES.map(() => h("span", { class: "tabular" }, "—"));
  legendNow.append(...legend(legendItems));

  let alive = true;
  let seeded = false;

  async function refresh() {
    if (!seeded) {
      seeded = true;
      if (await loadHistory(history) && alive) chart.update();
    }
    const st = await api("GET", "/v1/status");
    if (!alive) return;
    const c = st.counters || {};

    setText(sBroker.value, st.broker_id);
    setText(sBroker.extra, [st.accepting === false ? "stopping" : "accepting", st.tls ? "TLS" : null].filter(Boolean).join(" · "));
    setText(sVersion.value, st.version);
    setText(sVersion.extra, st.reloads ? `${st.reloads} config reload${st.reloads === 1 ? "" : "s"}` : "");
    setText(sUptime.value, fmtDuration(st.uptime_s));
    const storage = st.storage || {};
    setText(sStorage.value, `${storage.backend || "?"} · ${fmtBytes(storage.bytes)}`);
    const wal = storage.wal_bytes != null ? ` · WAL file ${fmtBytes(storage.wal_bytes)}` : "";
    setText(sStorage.extra, storage.commits != null ? `${fmtInt(storage.commits)} commits${wal}` : "");
    sStorage.value.title = storage.path || "";
    setText(sConns.value, String(st.connections ?? "—"));
    setText(sConns.extra, st.auth ? `auth: ${st.auth.mode}` : "");
    setText(sChannels.value, String(st.channels ?? "—"));
    setText(sChannels.extra, st.groups != null ? `${st.groups} reader group${st.groups === 1 ? "" : "s"}` : "");
    setText(sub, [st.http && `HTTP ${st.http}`, st.native && `native ${st.native}`].filter(Boolean).join(" · "));

    setText(tPub.value, String(c.published ?? 0));
    setText(tDel.value, String(c.delivered ?? 0));
    setText(tAck.value, String(c.acked ?? 0));
    for (const [key] of OTHER_COUNTERS) setText(otherEls[key], fmtInt(c[key] ?? 0));
    setText(otherEls.publisher_pauses, fmtInt(st.flow?.publisher_pauses ?? 0));
    setText(otherEls.slow_consumers_cut, fmtInt(st.flow?.slow_consumers_cut ?? 0));

    const refused = Object.entries(c.refused || {}).map(([reason, count]) => ({ reason, count }));
    refusalsTable.update(refused);
    refusalsTable.el.hidden = !refused.length;
    refusalsNone.hidden = refused.length > 0;
    const failures = Object.entries(st.auth?.failures || {}).map(([why, count]) => ({ why, count }));
    failuresTable.update(failures);
    failuresTable.el.hidden = !failures.length;
    failuresNone.hidden = failures.length > 0;

    // Server time (uptime) as the clock: rates are exact whatever the network delay.
    const rates = history.rates.sample(st.uptime_s, { p: c.published, d: c.delivered, a: c.acked });
    if (rates) {
      const values = [rates.p, rates.d, rates.a];
      history.push(values);
      chart.update();
      values.forEach((v, i) => setText(legendItems[i], fmtRate(v)));
    }
  }

  return {
    title: "Overview",
    refresh,
    destroy() {
      alive = false;
      chart.destroy();
    },
  };
}
