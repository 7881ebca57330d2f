// #/clients: registered clients and their access, rules, reserved channels,
// schemas (GET /v1/clients and GET /v1/status), with approve / reject / revoke.

import { api, session } from "../api.js";
import { card, confirmAction, createTable, emptyState, fill, h, scrollable, setText, stat, toast } from "../dom.js";
import { DASH, fmtAgo, fmtInt, fmtTime, plural } from "../format.js";

const STATUS_BADGE = { active: "badge-ok", pending: "badge-warn", revoked: "badge-danger" };

function patterns(list) {
  return list && list.length ? list.join(", ") : "nothing";
}

function accessView(access) {
  if (!access) return h("span", { class: "muted" }, DASH);
  return h("div", { class: "patterns", "data-testid": "client-access" },
    h("div", { "data-access": "read" }, h("span", { class: "k" }, "read"), patterns(access.read)),
    h("div", { "data-access": "write" }, h("span", { class: "k" }, "write"), patterns(access.write)),
    access.exclusive && access.exclusive.length
      ? h("div", { "data-access": "exclusive" }, h("span", { class: "k" }, "exclusive"), access.exclusive.join(", "))
      : null);
}

export function mount(view, params, ctx) {
  const sub = h("div", { class: "sub muted" });
  const head = h("div", { class: "page-head" }, h("div", null, h("h1", null, "Clients & security"), sub));

  // auth summary
  const sMode = stat("Authentication", "auth-mode", { small: true });
  const sClients = stat("Clients", "clients-count");
  const sPending = stat("Pending approval", "pending-count");
  const sTls = stat("TLS", "tls", { small: true });
  const stats = h("div", { class: "stats" }, sMode.el, sClients.el, sPending.el, sTls.el);

  // clients
  const table = createTable({
    testid: "clients-table",
    label: "Clients",
    sort: { key: "status", dir: "asc" },
    columns: [
      { key: "client_id", label: "Client", sort: true, class: "nowrap", cell: (td, c) => fill(td, c.client_id, () => h("strong", null, c.client_id)) },
      {
        key: "status", label: "Status", sort: true,
        value: (c) => ({ pending: 0, active: 1, revoked: 2 }[c.status] ?? 3),
        cell: (td, c) => fill(td, c.status, () => h("span", {
          class: `badge ${STATUS_BADGE[c.status] || ""}`, "data-testid": "client-status",
        }, c.status)),
      },
      {
        key: "actions", label: "", class: "actions",
        cell: (td, c) => fill(td, [c.status, c.client_id === session.identity?.client_id], () => actions(c)),
      },
      {
        key: "fingerprint", label: "Key fingerprint",
        cell: (td, c) => fill(td, [c.fingerprint, c.algorithm], () => h("span", {
          class: "fingerprint", title: `${c.algorithm || ""} ${c.fingerprint || ""}`.trim(),
        }, c.fingerprint ? (c.fingerprint.length > 24 ? c.fingerprint.slice(0, 24) + "…" : c.fingerprint) : DASH)),
      },
      { key: "admin", label: "Admin", sort: true, value: (c) => (c.admin ? 0 : c.admin_pending ? 1 : 2), cell: (td, c) => fill(td, `${!!c.admin}/${!!c.admin_pending}`, () => (c.admin ? h("span", { class: "badge badge-accent" }, "admin")
        : c.admin_pending ? h("span", { class: "badge badge-warn", "data-testid": "admin-pending", title: "Listed in auth.admins, but its key was registered as a non-admin's: approve it to make it an admin" }, "admin: waits for approval")
        : h("span", { class: "muted" }, "no"))) },
      { key: "connections", label: "Online", num: true, sort: true, cell: (td, c) => setText(td, fmtInt(c.connections ?? 0)) },
      {
        key: "last_seen", label: "Last seen", sort: true, value: (c) => -(c.last_seen || 0), class: "nowrap",
        cell: (td, c) => {
          setText(td, fmtAgo(c.last_seen));
          td.title = fmtTime(c.last_seen);
        },
      },
      {
        key: "access", label: "May read / write", class: "wrap",
        cell: (td, c) => fill(td, [c.admin, c.access || null], () => (c.admin
          ? h("div", { class: "patterns", "data-testid": "client-access" },
            h("div", { "data-access": "read" }, h("span", { class: "k" }, "read"), "everything (admin)"),
            h("div", { "data-access": "write" }, h("span", { class: "k" }, "write"), "everything (admin)"))
          : accessView(c.access))),
      },
      { key: "note", label: "Note", class: "wrap", cell: (td, c) => setText(td, c.note || "") },
    ],
    rowKey: (c) => c.client_id,
    rowAttrs: (c) => ({ "data-client": c.client_id, "data-status": c.status }),
    empty: () => emptyState("No clients registered yet",
      "A client registers its key the first time it connects; it is pending until an admin approves it " +
      "(or active at once when a rule accepts it). Make a key with:", "minou keygen billing-1"),
  });
  const clientsCard = card("Clients", { id: "clients-title",
    extra: h("span", { class: "hint muted" }, "access: what each client may read and write (rules, admins unrestricted)") });
  clientsCard.body.className = "";
  clientsCard.body.append(table.el);

  // rules
  const rulesBox = h("div", { "data-testid": "rules" });
  const rulesTable = createTable({
    testid: "rules-table",
    label: "Rules",
    columns: [
      { key: "client", label: "Client pattern", cell: (td, r) => fill(td, r.client, () => h("code", null, r.client)) },
      { key: "read", label: "Read", class: "wrap", cell: (td, r) => setText(td, patterns(r.read)) },
      { key: "write", label: "Write", class: "wrap", cell: (td, r) => setText(td, patterns(r.write)) },
      { key: "accept", label: "Accept", cell: (td, r) => setText(td, r.accept ? "auto-register" : "needs approval") },
    ],
    rowKey: (r) => r._i,
    rowAttrs: (r) => ({ "data-rule": r.client }),
    empty: () => emptyState(null, "No rules: every registered client reads and writes everything."),
  });
  const adminsLine = h("p", { class: "muted admins-line", "data-testid": "admins" });
  rulesBox.append(rulesTable.el, adminsLine);
  const rulesCard = card("Rules", { id: "rules-title",
    extra: h("span", { class: "hint muted" }, "a client gets the union of the rules its id matches") });
  rulesCard.body.className = "";
  rulesCard.body.append(rulesBox);

  // reservations
  const reservationsBox = h("div", { "data-testid": "reservations" });
  const reservationsTable = createTable({
    testid: "reservations-table",
    label: "Reserved channels",
    sort: { key: "channel", dir: "asc" },
    columns: [
      { key: "channel", label: "Reserved channel", sort: true, cell: (td, r) => fill(td, r.channel, () => h("code", null, r.channel)) },
      { key: "owner", label: "Owner", sort: true, cell: (td, r) => setText(td, r.owner) },
    ],
    rowKey: (r) => r.channel,
    rowAttrs: (r) => ({ "data-channel": r.channel }),
    empty: () => emptyState(null, "No reserved channel. An exclusive (!) read pattern reserves a channel for its first reader."),
  });
  reservationsBox.append(reservationsTable.el);
  const reservationsCard = card("Reservations", { id: "reservations-title" });
  reservationsCard.body.className = "";
  reservationsCard.body.append(reservationsBox);

  // schemas
  const schemasCard = card("Schemas", { id: "schemas-title", testid: "schemas" });
  const schemasSummary = h("dl", { class: "kv" });
  const schemasDeclared = h("dd", { "data-testid": "schemas-declared" });
  const schemasStrict = h("dd", { "data-testid": "schemas-strict" });
  const schemasRefused = h("dd", { "data-testid": "schemas-refused" });
  schemasSummary.append(
    h("dt", null, "Declared"), schemasDeclared,
    h("dt", null, "Strict"), schemasStrict,
    h("dt", null, "Refused"), schemasRefused);
  const verdicts = h("div", { "data-testid": "compatibility" });
  schemasCard.body.append(schemasSummary, h("h3", { class: "subhead" }, "Compatibility between versions"), verdicts);

  // auth failures
  const failuresCard = card("Authentication failures", { id: "failures-title" });
  const failuresBox = h("div", { "data-testid": "auth-failures" });
  failuresCard.body.append(failuresBox);

  view.replaceChildren(head, stats, clientsCard.el, rulesCard.el,
    h("div", { class: "grid grid-2" }, reservationsCard.el, failuresCard.el), schemasCard.el);

  // ------------------------------------------------------------ actions
  const latest = new Map(); // client id -> the last polled record

  function actions(built) {
    const c = new Proxy(built, { get: (t, k) => (latest.get(built.client_id) || t)[k] });
    const self = c.client_id === session.identity?.client_id;
    // Each button names the client it acts on ("Approve client billing-7"): a list
    // of "Approve" buttons tells a screen reader nothing.
    const btn = (testid, label, fn, danger = false) => h("button", {
      type: "button", class: `btn btn-sm${danger ? " btn-danger" : ""}`, "data-testid": testid,
      "aria-label": `${label} client ${c.client_id}`,
      onclick: (e) => fn(e.currentTarget),
    }, label);
    const approve = btn("approve", c.status === "revoked" ? "Re-approve" : "Approve", (b) => act(b, c, "approve", null,
      (r) => `approved '${c.client_id}'`));
    if (c.status === "pending") {
      return h("div", { class: "btn-row" }, approve,
        btn("reject", "Reject", (b) => act(b, c, "forget", {
          title: `Reject ${c.client_id}?`,
          text: `Its pending key (${c.fingerprint || "?"}) is forgotten; it may ask again with a new connection.`,
          yes: "Reject",
        }, () => `rejected '${c.client_id}'`), true));
    }
    if (c.status === "active") {
      const promote = c.admin_pending ? btn("approve-admin", "Approve as admin", (b) => act(b, c, "approve", {
        title: `Make ${c.client_id} an admin?`,
        text: `Its key (${c.fingerprint || "?"}) was registered as a non-admin's. Approve it only if you know this key is yours.`,
        yes: "Approve as admin",
      }, () => `approved '${c.client_id}' as admin`)) : null;
      const revoke = btn("revoke", "Revoke", (b) => act(b, c, "revoke", {
        title: `Revoke ${c.client_id}?`,
        text: `Its key stops working at once and its ${plural(c.connections ?? 0, "live connection")} ` +
          `${(c.connections ?? 0) === 1 ? "is" : "are"} closed. You can re-approve it later.`,
        yes: "Revoke",
      }, (r) => `revoked '${c.client_id}'` +
        (r.connections_closed ? ` (closed ${plural(r.connections_closed, "connection")})` : "")), true);
      if (self) {
        revoke.disabled = true;
        revoke.title = "You cannot revoke yourself";
      }
      return h("div", { class: "btn-row" }, ...(promote ? [promote] : []), revoke);
    }
    if (c.status === "revoked") return h("div", { class: "btn-row" }, approve);
    return null;
  }

  async function act(button, c, op, confirm, done) {
    if (confirm && !(await confirmAction(confirm))) return;
    button.disabled = true;
    try {
      const res = await api("POST", `/v1/clients/${encodeURIComponent(c.client_id)}/${op}`);
      toast(done(res || {}));
    } catch (exc) {
      toast(exc.message, { error: true });
    } finally {
      button.disabled = false;
      ctx.refreshNow();
    }
  }

  // ------------------------------------------------------------ refresh
  let alive = true;

  async function refresh() {
    const [cl, st] = await Promise.all([api("GET", "/v1/clients"), api("GET", "/v1/status")]);
    if (!alive) return;
    const clients = cl.clients || [];
    latest.clear();
    for (const c of clients) latest.set(c.client_id, c);
    const auth = st.auth || {};

    setText(sMode.value, auth.mode || DASH);
    setText(sMode.extra, auth.broker_token ? "broker token required" : "no broker token");
    // GET /v1/clients answers the first page (1,000, sorted by id); total counts all.
    const total = cl.total ?? clients.length;
    const unlisted = total - clients.length;
    setText(sClients.value, String(total));
    setText(sClients.extra, `${clients.filter((c) => c.connections).length} online` +
      (unlisted > 0 ? ` · ${unlisted} more not listed (minou clients list)` : ""));
    const pending = clients.filter((c) => c.status === "pending").length;
    setText(sPending.value, String(pending));
    sPending.el.classList.toggle("attention", pending > 0);
    setText(sTls.value, st.tls ? (st.tls.self_signed ? "self-signed" : "certificate") : "off");
    setText(sTls.extra, st.tls ? st.tls.fingerprint : "plain text (loopback)");
    setText(sub, `${plural(total, "client")} · ${pending}${cl.more ? "+" : ""} pending · ` +
      `${plural((cl.rules || []).length, "rule")} · ${plural(Object.keys(cl.reservations || {}).length, "reservation")}`);

    table.update(clients);
    rulesTable.update((cl.rules || []).map((r, i) => ({ ...r, _i: i })));
    setText(adminsLine, `Admins (unrestricted): ${(cl.admins || []).join(", ") || "none"}` +
      (auth.broker_token ? " · and holders of the broker token" : ""));
    reservationsTable.update(Object.entries(cl.reservations || {}).map(([channel, owner]) => ({ channel, owner })));

    // schemas
    const sc = st.schemas || {};
    const declared = sc.declared || [];
    fill(schemasDeclared, declared, () => (declared.length
      ? declared.map((k, i) => [i ? ", " : null, h("code", { "data-schema": k }, k)])
      : h("span", { class: "muted" }, "none: payloads are not validated")));
    setText(schemasStrict, sc.strict ? "yes: versions without a schema are refused" : "no");
    const refused = Object.entries(sc.refused || {});
    fill(schemasRefused, refused, () => (refused.length
      ? refused.map(([k, n], i) => [i ? ", " : null, h("span", { "data-schema-refused": k }, `${k}: ${fmtInt(n)}`)])
      : "none"));
    const comp = sc.compatibility || [];
    fill(verdicts, comp, () => (comp.length ? comp.map((c) => {
      const changes = c.changes || [];
      return h("div", { class: "verdict", "data-testid": "compat", "data-old": c.old, "data-new": c.new },
        h("div", null, h("code", null, c.old), " → ", h("code", null, c.new), ": ",
          h("span", { class: `badge ${c.compatible ? "badge-ok" : "badge-danger"}`, "data-testid": "verdict" },
            c.compatible ? "compatible" : "BREAKING")),
        changes.length
          ? h("ul", null, changes.map((ch) => h("li", {
            class: /\(breaking\)$|cannot verify/.test(ch) ? "breaking" : null,
          }, ch)))
          : h("div", { class: "muted" }, "no changes"));
    }) : h("p", { class: "muted flush" },
      "No endpoint declares two versions (e.g. orders/v1 and orders/v2) to compare.")));

    // auth failures
    const failures = Object.entries(auth.failures || {});
    fill(failuresBox, failures, () => (failures.length
      ? scrollable(h("div", { class: "table-wrap" }, h("table", null,
        h("thead", null, h("tr", null, h("th", null, "Why"), h("th", { class: "num" }, "Count"))),
        h("tbody", null, failures.map(([why, n]) => h("tr", { "data-why": why },
          h("td", null, h("code", null, why)), h("td", { class: "num" }, fmtInt(n))))))), "authentication failures")
      : h("p", { class: "muted flush" }, "none: no authentication failed since the broker started")));
  }

  return {
    title: "Clients & security",
    refresh,
    destroy() {
      alive = false;
    },
  };
}
