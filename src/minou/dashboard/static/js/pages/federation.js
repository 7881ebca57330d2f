// #/federation: the [[federation]] links of this broker (GET /v1/federation), one card
// per link with a row per direction (push: here to the remote, pull: the remote to
// here): its state, since when, the last error, messages carried, lag (the last figure
// known while a pull's remote is out of reach), loops skipped, messages dead-lettered
// here, channels the destination refuses and staged pages aborted.

import { api } from "../api.js";
import { card, createTable, emptyState, fill, h, setAttr, setText, show } from "../dom.js";
import { fmtAgo, fmtDuration, fmtInt, fmtTime, plural, fmtRate } from "../format.js";
import { queueHref } from "./queues.js";

const STATE_BADGE = { up: "badge-ok", retrying: "badge-danger" }; // the others: neutral
const STATE_HINT = {
  up: "Connected to both brokers: messages cross as they come",
  connecting: "Opening its connections to both brokers",
  retrying: "Failed (the error below): tried again with backoff, nothing lost meanwhile",
  starting: "Not started yet",
  stopped: "Stopped (the link was removed or changed, or the broker is stopping)",
  elsewhere: "Another broker of the cluster runs the links (the owner of _federation/v1)",
};
const DIRECTION_HINT = {
  push: "push: this broker's channels under these patterns go to the remote",
  pull: "pull: the remote's channels under these patterns come here",
};
const LAG_HINT = "Messages on the source not yet carried and, while some are, how long " +
  "ago the last one carried was published; while the direction is down the age goes on growing";
const LAST_KNOWN_HINT = "The remote is out of reach: this is the count of its last contact";
const NOT_COUNTED_HINT = "The remote has not been reached since this broker started: " +
  "nothing counted there yet";
const REFUSED_HINT = "Channels waiting on a refusal of the destination (a rule, a full " +
  "queue): tried again with backoff, the others go on";
const ORPHANS_HINT = "Pages a lost connection left staged on the destination, aborted " +
  "on the next connection (they would hold its staging room for an hour)";
const LOOPS_HINT = "Messages not sent because they came from the destination " +
  "(x-federated-from): links both ways do not loop";
const DEAD_HINT = "Messages the destination refused for what they are (a schema, a size), " +
  "kept in the dead letters on this broker with the reason (push: of the source channel, " +
  "pull: of the channel here)";
const EXAMPLE = `[[federation]]
name = "eu-us"
remote = "minou://us.example.com:7700"
key = "keys/bridge.key"        # the link's identity on the remote
push = ["orders/v1/*"]         # from here to there
pull = ["prices/*"]            # from there to here`;

const num = (v) => (v === null || v === undefined || v === "" ? null : Number(v));

/** Where a pipe's dead letters can be on this broker, one per pattern: the queue
 * "_dead/orders/v1" for orders/v1/* (with the link's prefix for a pull), or no queue
 * (plain text) for a pattern spanning versions (endpoint/*): it has no one page. */
function deadQueues(pipe) {
  return (pipe.patterns || []).map((p) => {
    if (p.startsWith("_dead/")) return { queue: null, text: p };
    const [endpoint, version] = p.split("/");
    const here = pipe.direction === "pull" ? pipe._prefix + endpoint : endpoint;
    return !version || version === "*"
      ? { queue: null, text: `_dead/${here}/*` }
      : { queue: `_dead/${here}/${version}`, text: `_dead/${here}/${version}` };
  }).filter((d, i, all) => all.findIndex((x) => x.text === d.text) === i);
}

/** How the last error reads: "bad" (the pipe is retrying on it), "warn" (up, but a
 * channel was refused since it came up: the others go on), "old" (before the pipe's
 * present state). */
function errorKind(p) {
  if (!p.last_error) return null;
  if (p.state === "retrying") return "bad";
  if (p.state === "up" && num(p.last_error_at) !== null && num(p.last_error_at) >= num(p.since)) return "warn";
  return "old";
}

function pipesTable(link) {
  return createTable({
    testid: "pipes-table",
    label: `Directions of link ${link}`,
    columns: [
      {
        key: "direction", label: "Direction", class: "wrap",
        cell: (td, p) => fill(td, [p.direction, p.patterns, p.remote_broker, p.channels, p.state === "up"], () => [
          h("div", { class: "direction", title: DIRECTION_HINT[p.direction] || null },
            h("strong", { "data-testid": "pipe-direction" }, p.direction), " ",
            h("span", { class: "muted" }, p.direction === "pull"
              ? `from ${p.remote_broker || "the remote"} to here` : `from here to ${p.remote_broker || "the remote"}`)),
          h("div", { class: "pattern-list", "data-testid": "pipe-patterns" },
            (p.patterns || []).map((x) => h("code", null, x))),
          p.state === "up" || p.channels
            ? h("div", { class: "muted small" }, plural(fmtInt(p.channels ?? 0), "channel"), " matched on the source")
            : null,
        ]),
      },
      {
        key: "state", label: "State", class: "state-cell",
        cell: (td, p) => {
          if (!td._ui) {
            const badge = h("span", { "data-testid": "pipe-state" });
            const since = h("span", { class: "muted small nowrap", "data-testid": "pipe-since" });
            const when = h("span", { class: "pipe-error-when" });
            const text = h("span", { "data-testid": "pipe-error" });
            const error = h("div", { class: "pipe-error" }, when, text);
            td._ui = { badge, since, when, text, error };
            td.append(h("div", { class: "state-line" }, badge, " ", since), error);
          }
          const ui = td._ui;
          setText(ui.badge, p.state);
          setAttr(ui.badge, "class", `badge ${STATE_BADGE[p.state] || ""}`.trim());
          setAttr(ui.badge, "title", STATE_HINT[p.state] || null);
          setText(ui.since, p.since ? `since ${fmtAgo(num(p.since))}` : "");
          setAttr(ui.since, "title", p.since ? fmtTime(num(p.since)) : null);
          const kind = errorKind(p);
          show(ui.error, !!kind);
          setAttr(ui.error, "data-kind", kind);
          setAttr(ui.error, "role", kind === "bad" ? "alert" : null);
          setText(ui.when, kind ? `${kind === "old" ? "last error" : "error"}, ${fmtAgo(num(p.last_error_at))}: ` : "");
          setAttr(ui.when, "title", kind ? fmtTime(num(p.last_error_at)) : null);
          setText(ui.text, p.last_error || "");
        },
      },
      {
        key: "forwarded", label: "Carried", num: true, title: "Messages this direction committed on the destination",
        cell: (td, p) => {
          td.dataset.testid = "pipe-forwarded";
          setText(td, fmtInt(p.forwarded));
        },
      },
      {
        key: "rate", label: "Rate", num: true, title: "Messages carried per second over the last 10 s",
        cell: (td, p) => {
          td.dataset.testid = "pipe-rate";
          setText(td, fmtRate(num(p.rate)));
        },
      },
      {
        key: "lag", label: "Lag", num: true, title: LAG_HINT,
        cell: (td, p) => {
          td.dataset.testid = "pipe-lag";
          if (!td._ui) {
            const figures = h("span");
            const note = h("div", { class: "muted small nowrap", "data-testid": "pipe-lag-known" });
            td._ui = { figures, note };
            td.append(figures, note);
          }
          // A pull whose remote is out of reach: its count is the last contact's.
          const counted = num(p.lag_counted_at);
          const known = !!p.lag_last_known;
          setText(td._ui.figures, `${known && counted === null ? "?" : fmtInt(p.lag_messages)} msg · ` +
            fmtDuration(num(p.lag_seconds)));
          show(td._ui.note, known);
          setText(td._ui.note, !known ? "" : counted === null ? "not counted yet" : `last known, ${fmtAgo(counted)}`);
          setAttr(td, "data-last-known", known ? "" : null);
          setAttr(td._ui.note, "title", !known ? null : counted === null ? NOT_COUNTED_HINT
            : `${LAST_KNOWN_HINT}, ${fmtTime(counted)}`);
        },
      },
      {
        key: "skipped_loops", label: "Loops skipped", num: true, thClass: "th-wrap", title: LOOPS_HINT,
        cell: (td, p) => {
          td.dataset.testid = "pipe-skipped";
          setText(td, fmtInt(p.skipped_loops));
        },
      },
      {
        key: "dead_lettered", label: "Dead-lettered", num: true, thClass: "th-wrap", title: DEAD_HINT,
        cell: (td, p) => {
          const dead = num(p.dead_lettered) || 0;
          fill(td, [dead, p.direction, p.patterns, p._prefix], () => [
            h("span", { "data-testid": "pipe-dead", class: dead > 0 ? "warn-text" : null }, fmtInt(dead)),
            dead > 0 ? h("div", { class: "dead-links small" }, deadQueues(p).map((d) => h("div", null,
              d.queue ? h("a", { href: queueHref(d.queue), "data-testid": "pipe-dead-link" }, d.text)
                : h("code", null, d.text)))) : null,
          ]);
        },
      },
      {
        key: "refused_channels", label: "Refused channels", num: true, thClass: "th-wrap", title: REFUSED_HINT,
        cell: (td, p) => {
          const n = num(p.refused_channels);
          fill(td, [n], () => [
            h("span", { "data-testid": "pipe-refused", class: n > 0 ? "warn-text" : null }, fmtInt(n)),
          ]);
        },
      },
      {
        key: "orphans_dropped", label: "Orphans dropped", num: true, thClass: "th-wrap", title: ORPHANS_HINT,
        cell: (td, p) => {
          td.dataset.testid = "pipe-orphans";
          setText(td, fmtInt(num(p.orphans_dropped)));
        },
      },
    ],
    rowKey: (p) => p.direction,
    rowAttrs: (p) => ({ "data-direction": p.direction, "data-state": p.state }),
    empty: () => emptyState(null, "This link has no direction: give it push or pull patterns."),
  });
}

/** One link's card: updated in place at each poll. */
function linkCard(link) {
  const remote = h("code", { "data-testid": "link-remote" });
  const prefix = h("span", { class: "muted", "data-testid": "link-prefix" });
  const c = card(link.name, {
    id: `federation-link-${link.name}`, // names are letters, digits, '-' and '_'
    extra: h("span", { class: "hint link-where" }, h("span", { class: "muted" }, "remote "), remote, h("span", { class: "muted" }, " · "), prefix),
  });
  c.el.dataset.testid = "federation-link";
  c.el.dataset.link = link.name;
  c.body.className = "";
  const table = pipesTable(link.name);
  c.body.append(table.el);
  return {
    el: c.el,
    update(ln) {
      setText(remote, ln.remote);
      setText(prefix, ln.prefix ? `prefix ${ln.prefix}` : "no prefix");
      setAttr(prefix, "title", ln.prefix ? `Put before each channel's endpoint on the destination: orders/v1/1 arrives as ${ln.prefix}orders/v1/1` : null);
      // The prefix goes with each direction for its dead-letter links (a pull's channels here have it).
      table.update((ln.pipes || []).map((p) => ({ ...p, _prefix: ln.prefix || "" })));
    },
  };
}

export function mount(view) {
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" }, h("div", null, h("h1", null, "Federation"), sub));

  const noneCard = card("No federation link", { id: "federation-none-title", testid: "federation-none" });
  noneCard.body.className = "";
  noneCard.body.append(emptyState(null,
    "A federation link shares chosen channels with a broker in another place, each message " +
    "exactly once, over connections this broker opens to the other one. Links are declared with [[federation]] " +
    "tables in the broker's config, then minou reload (docs/federation.md). For example:", EXAMPLE));
  noneCard.el.hidden = true;

  const list = h("div", { class: "grid", "data-testid": "federation-links" });
  const cards = new Map(); // link name -> linkCard

  view.replaceChildren(head, noneCard.el, list);

  let alive = true;

  async function refresh() {
    const data = await api("GET", "/v1/federation");
    if (!alive) return;
    const links = data.links || [];
    show(noneCard.el, !links.length);
    const seen = new Set();
    links.forEach((ln, i) => {
      seen.add(ln.name);
      let c = cards.get(ln.name);
      if (!c) {
        c = linkCard(ln);
        cards.set(ln.name, c);
      }
      c.update(ln);
      if (list.children[i] !== c.el) list.insertBefore(c.el, list.children[i] || null);
    });
    for (const [name, c] of cards) {
      if (!seen.has(name)) {
        c.el.remove();
        cards.delete(name);
      }
    }
    const pipes = links.flatMap((ln) => ln.pipes || []);
    const counts = new Map();
    for (const p of pipes) counts.set(p.state, (counts.get(p.state) || 0) + 1);
    const order = ["up", "retrying", "connecting", "starting", "elsewhere", "stopped"];
    const states = [...counts].sort((a, b) => order.indexOf(a[0]) - order.indexOf(b[0]))
      .map(([s, n]) => `${n} ${s}`).join(", ");
    setText(sub, links.length
      ? `${plural(links.length, "link")} · ${plural(pipes.length, "direction")}${states ? `: ${states}` : ""}`
      : "no link configured");
  }

  return {
    title: "Federation",
    refresh,
    destroy() {
      alive = false;
    },
  };
}
