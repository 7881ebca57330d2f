// Live rate charts (uPlot, vendored in vendor/). A chart starts from the broker's
// last ten minutes (GET /v1/rates/history, one sample a second), then goes on
// with rates from counter deltas between two polls; a RateSeries keeps the
// samples, a RateChart draws one. The three lines differ in colour (blue,
// orange, green: apart for colour-blind eyes too) and in dash pattern.

import { api } from "./api.js";
import { fmtCompact, fmtRate } from "./format.js";

const MAX_POINTS = 1200; // the broker's 10 minutes at 1/s, then 10 more at one per 2 s poll

export const RATE_SERIES = [
  { label: "publish", color: "--chart-publish", dash: [], history: "published" },
  { label: "deliver", color: "--chart-deliver", dash: [8, 4], history: "delivered" },
  { label: "ack", color: "--chart-ack", dash: [2, 3], history: "acked" },
];

/** A legend swatch: a short line in the series' colour and dash pattern. */
export function swatch(s) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", `sw sw-${s.label}`);
  svg.setAttribute("viewBox", "0 0 22 6");
  svg.setAttribute("aria-hidden", "true");
  svg.dataset.dash = s.dash.join(",") || "solid";
  const line = document.createElementNS(ns, "line");
  for (const [k, v] of [["x1", 1], ["y1", 3], ["x2", 21], ["y2", 3]]) line.setAttribute(k, String(v));
  line.style.stroke = `var(${s.color})`;
  line.style.strokeWidth = "2.5";
  if (s.dash.length) line.style.strokeDasharray = s.dash.join(" ");
  svg.append(line);
  return svg;
}

/** A legend of the three series, for a card's head. */
export function legend(values = null) {
  return RATE_SERIES.map((s, i) => {
    const item = document.createElement("span");
    item.className = "legend-item";
    item.append(swatch(s), `${s.label}${values ? " " : ""}`);
    if (values) item.append(values[i]);
    return item;
  });
}

/** Turns monotonic counters into per-second rates between two samples. */
export class CounterRates {
  constructor() {
    this.prev = null;
  }

  reset() {
    this.prev = null;
  }

  /** t: seconds (any monotonic clock); counters: {name: number|null}. Returns {name: rate|null} or null (first sample). */
  sample(t, counters) {
    const prev = this.prev;
    this.prev = { t, counters };
    if (!prev || t <= prev.t) return null;
    const dt = t - prev.t;
    const out = {};
    for (const [k, v] of Object.entries(counters)) {
      const before = prev.counters[k];
      out[k] = typeof v === "number" && typeof before === "number" && v >= before ? (v - before) / dt : null;
    }
    return out;
  }
}

/** Samples kept for a chart: x (unix seconds) and one array per series. */
export class RateSeries {
  constructor(n = RATE_SERIES.length) {
    this.x = [];
    this.ys = Array.from({ length: n }, () => []);
    this.count = 0; // real samples plotted so far (gaps not counted)
    this.rates = new CounterRates();
  }

  push(values, t = Date.now() / 1000) {
    this.x.push(t);
    this.ys.forEach((y, i) => y.push(values[i] ?? null));
    if (values.some((v) => v !== null && v !== undefined)) this.count++;
    if (this.x.length > MAX_POINTS) {
      this.x.shift();
      this.ys.forEach((y) => y.shift());
    }
  }

  /** Break the line (the page was not polled for a while). */
  gap() {
    this.rates.reset();
    if (this.x.length && this.ys[0][this.ys[0].length - 1] !== null) {
      this.push(this.ys.map(() => null), this.x[this.x.length - 1] + 0.001);
    }
  }

  data() {
    return [this.x, ...this.ys];
  }

  /**
   * Start again from the broker's history (GET /v1/rates/history): its samples, moved
   * onto this browser's clock, replace what the series had; live polls go on from there.
   * Returns false (the series untouched) when the broker has none.
   */
  seed(history) {
    const t = history && history.t;
    if (!t || !t.length) return false;
    const shift = Date.now() / 1000 - (history.now ?? t[t.length - 1]);
    this.x = [];
    this.ys = this.ys.map(() => []);
    this.count = 0;
    this.rates.reset();
    t.forEach((when, i) => this.push(RATE_SERIES.map((s) => history[s.history]?.[i] ?? null), when + shift));
    return true;
  }
}

/** Seed ``series`` from the broker's last minutes (of ``queue``, or of the broker). */
export async function loadHistory(series, queue = null) {
  try {
    return series.seed(await api("GET", "/v1/rates/history", { query: { queue } }));
  } catch {
    return false; // an older broker, or a hiccup: the chart fills from the polls
  }
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

/** A uPlot chart of a RateSeries in container; container gets data-points. */
export class RateChart {
  constructor(container, series, { height = 220 } = {}) {
    this.container = container;
    this.series = series;
    this.height = height;
    this.plot = null;
    this.empty = document.createElement("div");
    this.empty.className = "chart-empty";
    this.empty.textContent = "Collecting samples…";
    container.append(this.empty);
    container.dataset.points = String(series.count);
    this.onTheme = () => this.rebuild();
    window.addEventListener("minou:theme", this.onTheme);
    this.resize = new ResizeObserver(() => this.fit());
    this.resize.observe(container);
    this.rebuild();
  }

  size() {
    const w = Math.max(200, this.container.clientWidth - 16);
    const h = window.innerWidth < 600 ? Math.min(this.height, 180) : this.height;
    return { width: w, height: h };
  }

  rebuild() {
    if (this.plot) {
      this.plot.destroy();
      this.plot = null;
    }
    if (typeof window.uPlot !== "function") {
      this.empty.textContent = "Chart library missing (vendor/uPlot.iife.min.js); run dashboard/build.sh";
      return;
    }
    const muted = cssVar("--muted");
    const grid = cssVar("--chart-grid");
    const font = `11px ${getComputedStyle(document.body).fontFamily}`;
    const axis = { stroke: muted, font, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    const opts = {
      ...this.size(),
      cursor: { drag: { x: false, y: false } },
      legend: { show: false },
      scales: {
        x: { time: true, auto: false, range: () => this.window() },
        y: { range: (u, min, max) => [0, max && max > 0 ? max * 1.15 : 1] },
      },
      series: [
        { value: (u, v) => (v === null || v === undefined ? "" : new Date(v * 1000).toLocaleTimeString()) },
        ...RATE_SERIES.map((s) => ({
          label: s.label,
          stroke: cssVar(s.color),
          width: 2,
          dash: s.dash,
          value: (u, v) => fmtRate(v),
        })),
      ],
      axes: [
        {
          ...axis,
          space: 70,
          values: (u, splits) => {
            const step = splits.length > 1 ? splits[1] - splits[0] : 60;
            const p = (n) => String(n).padStart(2, "0");
            return splits.map((v) => {
              const d = new Date(v * 1000);
              return `${p(d.getHours())}:${p(d.getMinutes())}` + (step < 60 ? `:${p(d.getSeconds())}` : "");
            });
          },
        },
        { ...axis, size: 48, values: (u, splits) => splits.map((v) => fmtCompact(v)) },
      ],
    };
    this.plot = new window.uPlot(opts, this.series.data(), this.container);
    const [min, max] = this.window();
    this.plot.setScale("x", { min, max });
    this.container.append(this.empty); // keep the overlay above the canvas
    this.sync();
  }

  /** The x range: at least 2 minutes, so a few samples do not stretch over years or milliseconds. */
  window() {
    const x = this.series.x;
    if (!x.length) {
      const now = Date.now() / 1000;
      return [now - 120, now];
    }
    const max = x[x.length - 1];
    return [Math.min(x[0], max - 120), max];
  }

  fit() {
    if (this.plot) this.plot.setSize(this.size());
  }

  /** Redraw after series.push(). */
  update() {
    if (this.plot) {
      this.plot.setData(this.series.data(), false);
      const [min, max] = this.window();
      this.plot.setScale("x", { min, max });
    }
    this.sync();
  }

  sync() {
    this.container.dataset.points = String(this.series.count);
    this.empty.hidden = this.series.count > 0;
  }

  destroy() {
    window.removeEventListener("minou:theme", this.onTheme);
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
