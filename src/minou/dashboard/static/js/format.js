// Human formats: 1.2k msg/s, 3 min ago, 12.4 MB. Every function accepts
// null/undefined and returns "—" for them (or "never" for times).

export const DASH = "—";

const missing = (v) => v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v));

/** 1234567 -> "1,234,567" (exact, for counts in tables). */
export function fmtInt(n) {
  if (missing(n)) return DASH;
  return Math.round(Number(n)).toLocaleString("en-US");
}

/** 950 -> "950", 1234 -> "1.2k", 12345 -> "12k", 2.5e6 -> "2.5M", 0.25 -> "0.25". */
export function fmtCompact(n) {
  if (missing(n)) return DASH;
  const v = Number(n);
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a < 1) return trim(v.toFixed(2));
  if (a < 10) return trim(v.toFixed(1));
  if (a < 1000) return String(Math.round(v));
  for (const [unit, size] of [["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
    if (a >= size * 0.9995) {
      const x = v / size;
      return (Math.abs(x) < 10 ? trim(x.toFixed(1)) : String(Math.round(x))) + unit;
    }
  }
  return String(Math.round(v));
}

function trim(s) {
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

/** 1234.5 -> "1.2k msg/s". */
export function fmtRate(r) {
  if (missing(r)) return DASH;
  return `${fmtCompact(r)} msg/s`;
}

/** 12_400_000 -> "11.8 MB" (binary units, as `du -h`). */
export function fmtBytes(n) {
  if (missing(n)) return DASH;
  let v = Number(n);
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  if (i === 0) return `${Math.round(v)} B`;
  return `${v < 10 ? v.toFixed(1) : v < 100 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** Seconds -> "0.4 s", "12 s", "3 min 12 s", "2 h 5 min", "3 d 4 h". */
export function fmtDuration(s) {
  if (missing(s)) return DASH;
  let v = Math.max(0, Number(s));
  if (v < 1) return `${trim(v.toFixed(1))} s`;
  if (v < 60) return `${Math.floor(v)} s`;
  const d = Math.floor(v / 86400);
  const h = Math.floor((v % 86400) / 3600);
  const m = Math.floor((v % 3600) / 60);
  const sec = Math.floor(v % 60);
  if (d > 0) return h ? `${d} d ${h} h` : `${d} d`;
  if (h > 0) return m ? `${h} h ${m} min` : `${h} h`;
  if (m < 10 && sec) return `${m} min ${sec} s`;
  return `${m} min`;
}

/** Unix seconds -> "just now", "12 s ago", "3 min ago", "2 h ago", "4 d ago"; null -> "never". */
export function fmtAgo(ts, now = Date.now() / 1000) {
  if (missing(ts) || ts === 0) return "never";
  const s = now - Number(ts);
  if (s < -5) return `in ${fmtDurationShort(-s)}`;
  if (s < 5) return "just now";
  return `${fmtDurationShort(s)} ago`;
}

/** Seconds -> "12 s", "3 min", "2 h", "4 d" (one unit). */
export function fmtDurationShort(s) {
  if (missing(s)) return DASH;
  const v = Math.max(0, Number(s));
  if (v < 60) return `${Math.floor(v)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min`;
  if (v < 86400) return `${Math.floor(v / 3600)} h`;
  return `${Math.floor(v / 86400)} d`;
}

/** Unix seconds -> local "2025-11-22 14:03:12" (for title attributes). */
export function fmtTime(ts) {
  if (missing(ts) || ts === 0) return "";
  const d = new Date(Number(ts) * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
    `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** "3 messages" / "1 message". */
export function plural(n, word, many = `${word}s`) {
  return `${n} ${Number(n) === 1 ? word : many}`;
}
