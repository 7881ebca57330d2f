// Small DOM helpers: element construction, in-place updates (no full
// re-renders: polling keeps focus, scroll and open details), the confirmation
// dialog and the toast.

/**
 * h("a", {href: "#/x", class: "c", "data-testid": "t", onclick: fn}, "text", child, [more])
 * Props: class, text, on<event> (functions), hidden/disabled (booleans), anything
 * else as an attribute (null/false skip it).
 */
export function h(tag, props = null, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/** Set text only when it changed (no needless DOM mutations). */
export function setText(el, text) {
  const t = String(text ?? "");
  if (el.textContent !== t) el.textContent = t;
}

/** Set an attribute only when it changed; null removes it. */
export function setAttr(el, name, value) {
  if (value === null || value === undefined || value === false) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else {
    const v = value === true ? "" : String(value);
    if (el.getAttribute(name) !== v) el.setAttribute(name, v);
  }
}

/** Rebuild el's children with build() only when sig (any JSON-able value) changed. */
export function fill(el, sig, build) {
  const key = typeof sig === "string" ? sig : JSON.stringify(sig);
  if (el._sig === key) return;
  el._sig = key;
  el.replaceChildren(...[build()].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

/** Show (or hide) the element. */
export function show(el, visible) {
  if (el.hidden === !!visible) el.hidden = !visible;
}

/* ------------------------------------------------------------ confirm dialog */

/**
 * Ask before a destructive action. Resolves true (confirm-yes) or false
 * (confirm-no, Escape, backdrop).
 */
export function confirmAction({ title, text, yes = "Confirm" }) {
  const dialog = document.getElementById("confirm");
  dialog.querySelector("#confirm-title").textContent = title;
  dialog.querySelector("#confirm-text").textContent = text || "";
  dialog.querySelector("[data-testid=confirm-yes]").textContent = yes;
  if (dialog.open) dialog.close("no");
  dialog.returnValue = "";
  return new Promise((resolve) => {
    const done = () => {
      dialog.removeEventListener("close", done);
      dialog.removeEventListener("click", outside);
      resolve(dialog.returnValue === "yes");
    };
    const outside = (e) => { // a click on the backdrop (outside the dialog's box)
      if (e.target !== dialog) return;
      const r = dialog.getBoundingClientRect();
      if (e.clientX < r.left || e.clientX > r.right || e.clientY < r.top || e.clientY > r.bottom) {
        dialog.close("no");
      }
    };
    dialog.addEventListener("close", done);
    dialog.addEventListener("click", outside);
    dialog.showModal();
    dialog.querySelector("[data-testid=confirm-no]").focus();
  });
}

/* ------------------------------------------------------------ toast */

let toastTimer = null;

/** A toast never covers the focused control: bottom right, or top right when the
 * focus sits under it. Checked on show and whenever the focus moves. */
function keepClearOfFocus(el) {
  const region = el.parentElement;
  region.classList.remove("top");
  if (el.hidden) return;
  const f = document.activeElement;
  if (!f || f === document.body) return;
  const a = el.getBoundingClientRect();
  const b = f.getBoundingClientRect();
  if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) {
    region.classList.add("top");
  }
}
document.addEventListener("focusin", () => {
  const el = document.querySelector("[data-testid=toast]");
  if (el) keepClearOfFocus(el);
});

/** One toast at a time (aria-live region); errors stay longer. Click dismisses it. */
export function toast(text, { error = false } = {}) {
  const el = document.querySelector("[data-testid=toast]");
  if (!el._wired) {
    el._wired = true;
    el.addEventListener("click", () => { el.hidden = true; });
  }
  clearTimeout(toastTimer);
  el.textContent = text;
  el.classList.toggle("error", error);
  el.setAttribute("role", error ? "alert" : "status");
  el.hidden = false;
  keepClearOfFocus(el);
  toastTimer = setTimeout(() => { el.hidden = true; }, error ? 9000 : 5000);
}

/* ------------------------------------------------------- scrolling regions */

// A region whose content is wider or taller than itself must be reachable by
// keyboard (a focus stop that arrow keys scroll) and named; one that fits takes no
// tab stop. Re-checked whenever the region or its content changes size.
const scrollWatch = typeof ResizeObserver === "undefined" ? null
  : new ResizeObserver((entries) => {
    for (const e of entries) markScrollable(e.target.closest("[data-scroll-label]"));
  });

function markScrollable(el) {
  if (!el) return;
  const over = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
  if (over === el.classList.contains("scrolls")) return;
  el.classList.toggle("scrolls", over);
  if (over) {
    el.tabIndex = 0;
    el.setAttribute("role", "region");
    el.setAttribute("aria-label", `${el.dataset.scrollLabel} (scrolls)`);
  } else {
    el.removeAttribute("tabindex");
    el.removeAttribute("role");
    el.removeAttribute("aria-label");
  }
}

/** Mark ``el`` as a region that may scroll (see above); returns it. */
export function scrollable(el, label) {
  el.dataset.scrollLabel = label;
  if (scrollWatch) {
    scrollWatch.observe(el);
    if (el.firstElementChild) scrollWatch.observe(el.firstElementChild);
  }
  return el;
}

/* ------------------------------------------------------------ keyed tables */

/**
 * A table updated in place, row per key.
 *   columns: [{key, label, num, sort: true, value: item => sortable, cell: (td, item) => void,
 *              class}]
 *   rowKey: item => string;  rowAttrs: item => {attr: value}
 *   empty: () => Node (shown under the header when there are no items)
 *   sort: {key, dir: "asc"|"desc"} (optional; sortable headers toggle it, then call onSort)
 */
export function createTable({ testid, columns, rowKey, rowAttrs, empty, sort = null, label, onSort = null }) {
  const state = { sort, items: [], rows: new Map() };
  const thead = h("thead");
  const tbody = h("tbody");
  const table = h("table", { "data-testid": testid, "aria-label": label || null }, thead, tbody);
  const emptyBox = h("div", { class: "table-empty", hidden: true });
  const tableWrap = scrollable(h("div", { class: "table-wrap" }, table), label || "table");
  const wrap = h("div", null, tableWrap, emptyBox);
  const headRow = h("tr");
  const ths = new Map();
  for (const col of columns) {
    const cls = [col.num ? "num" : "", col.thClass || ""].join(" ").trim() || null;
    let th;
    if (col.sort) {
      th = h("th", { class: cls, scope: "col", "data-sort": col.key },
        h("button", { type: "button" }, col.label, h("span", { class: "arrow", "aria-hidden": "true" }, "↕")));
      th.addEventListener("click", () => {
        const cur = state.sort;
        state.sort = cur && cur.key === col.key
          ? { key: col.key, dir: cur.dir === "asc" ? "desc" : "asc" }
          : { key: col.key, dir: "asc" };
        if (onSort) onSort(state.sort);
        render();
      });
    } else {
      // A column of buttons still has a header a screen reader can name.
      th = h("th", { class: cls, scope: "col" },
        col.label || h("span", { class: "sr-only" }, col.srLabel || "Actions"));
    }
    if (col.title) th.title = col.title;
    ths.set(col.key, th);
    headRow.append(th);
  }
  thead.append(headRow);

  function sorted(items) {
    if (!state.sort) return items;
    const col = columns.find((c) => c.key === state.sort.key);
    if (!col) return items;
    const val = col.value || ((x) => x[col.key]);
    const sign = state.sort.dir === "asc" ? 1 : -1;
    return [...items].sort((a, b) => {
      const x = val(a);
      const y = val(b);
      let c;
      if (x === y) c = 0;
      else if (x === null || x === undefined) c = -1;
      else if (y === null || y === undefined) c = 1;
      else if (typeof x === "number" && typeof y === "number") c = x - y;
      else c = String(x).localeCompare(String(y), "en", { numeric: true });
      if (c === 0) c = String(rowKey(a)).localeCompare(String(rowKey(b)), "en", { numeric: true });
      return c * sign;
    });
  }

  function render() {
    for (const [key, th] of ths) {
      const on = state.sort && state.sort.key === key;
      setAttr(th, "aria-sort", on ? (state.sort.dir === "asc" ? "ascending" : "descending") : null);
      const arrow = th.querySelector(".arrow");
      if (arrow) setText(arrow, on ? (state.sort.dir === "asc" ? "▲" : "▼") : "↕");
    }
    const items = sorted(state.items);
    if (!items.length) {
      for (const tr of state.rows.values()) tr.remove();
      state.rows.clear();
      // Below the table, not in a row: it stays in view when the table scrolls sideways.
      emptyBox.replaceChildren(empty ? empty() : h("div", { class: "empty" }, "Nothing here."));
      emptyBox.hidden = false;
      return;
    }
    emptyBox.hidden = true;
    const seen = new Set();
    const order = [];
    for (const item of items) {
      const key = String(rowKey(item));
      seen.add(key);
      let tr = state.rows.get(key);
      if (!tr) {
        tr = h("tr");
        for (const col of columns) tr.append(h("td", { class: [col.num ? "num" : "", col.class || ""].join(" ").trim() || null }));
        state.rows.set(key, tr);
      }
      if (rowAttrs) for (const [k, v] of Object.entries(rowAttrs(item))) setAttr(tr, k, v);
      columns.forEach((col, i) => {
        const td = tr.children[i];
        if (col.cell) col.cell(td, item, tr);
        else setText(td, item[col.key] ?? "");
      });
      order.push(tr);
    }
    for (const [key, tr] of state.rows) {
      if (!seen.has(key)) {
        tr.remove();
        state.rows.delete(key);
      }
    }
    // Reorder only when needed (moving a row would drop the focus inside it).
    const current = Array.from(tbody.children);
    if (current.length !== order.length || order.some((tr, i) => current[i] !== tr)) {
      order.forEach((tr, i) => {
        if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
      });
    }
  }

  return {
    el: wrap,
    table,
    update(items) {
      state.items = items;
      render();
    },
  };
}

/** An empty-state block: a title, text and optional <pre> example. */
export function emptyState(title, text, example = null) {
  return h("div", { class: "empty" },
    title ? h("h3", null, title) : null,
    text ? h("p", null, text) : null,
    example ? scrollable(h("pre", null, h("code", null, example)), title || "example") : null);
}

/** A card: <section class="card"> with a header (title, extra) and a body. */
export function card(title, { extra = null, testid = null, bodyClass = "card-body", id = null } = {}) {
  const body = h("div", { class: bodyClass });
  const head = title !== null
    ? h("div", { class: "card-head" }, h("h2", { id }, title), extra)
    : null;
  const el = h("section", { class: "card", "data-testid": testid, "aria-labelledby": id }, head, body);
  return { el, body, head };
}

/** A stat tile; returns {el, value, extra}. */
export function stat(label, testid = null, { small = false } = {}) {
  const value = h("div", { class: small ? "value small" : "value", "data-testid": testid }, "—");
  const extra = h("div", { class: "extra" });
  const el = h("div", { class: "card stat" }, h("div", { class: "label" }, label), value, extra);
  return { el, value, extra };
}
