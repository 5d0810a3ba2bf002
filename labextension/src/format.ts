/**
 * One formatter per unit, shared by everything in the frontend (panel, charts, status bar), so
 * that a figure reads the same wherever it appears.
 *
 * The rules (the Python monitor follows the same ones, so a notebook and the panel agree):
 *
 * - **Precision** of a measured quantity with a fractional part (GiB, MiB, seconds): about three
 *   significant figures — a value below 10 gets two decimals, below 100 one decimal, otherwise
 *   none: `5.70 GiB`, `12.1 GiB`, `140 GiB`, `0.42 s`, `3.91 s`, `12.5 s`. The decision is made on
 *   the rounded value, so 9.996 is `10.0`, not `10.00`.
 * - **Bytes** are binary: GiB from 1 GiB up, MiB below (`630 MiB`, `0.50 MiB`); exactly zero is
 *   `0 MiB`. A value that rounds up to 1024 of a unit is written in the next one (`1.00 GiB`).
 *   The status bar's short form drops the space and the "iB": `12.1G`, `630M`.
 * - **Integers** for percentages (`37%`, no space, as nvidia-smi writes it), temperatures
 *   (`39 °C`, with a space) and watts (`534 / 700 W`).
 * - **Unknown** is an en dash, `–`, never `NaN` or `null`.
 * - **Clock times** are the browser's local time, `hh:mm:ss` on a 24-hour clock (`hh:mm` for a
 *   moment to come, such as when an idle kernel will be shut down).
 * - **Durations** (how long a kernel has been idle) count whole units down, never up: under a
 *   minute in seconds (`45 s`), under an hour in minutes (`12 min`), else hours and two-digit
 *   minutes (`2 h 01 min`, `26 h 00 min`).
 */

export const MIB = 1024 ** 2;
export const GIB = 1024 ** 3;

/** The dash that stands for an unknown value. */
export const UNKNOWN = '–';

function isNum(v: number | null | undefined): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

/** A number with the precision rule above: two decimals below 10, one below 100, else none. */
export function formatNumber(value: number): string {
  const abs = Math.abs(value);
  let decimals = abs < 10 ? 2 : abs < 100 ? 1 : 0;
  let text = value.toFixed(decimals);
  // 9.996 rounds to "10.00": one decimal fewer, as if the value had been 10 to begin with.
  while (decimals > 0 && Math.abs(Number(text)) >= (decimals === 2 ? 10 : 100)) {
    decimals--;
    text = value.toFixed(decimals);
  }
  return text;
}

/** The number's text and its unit, the unit chosen on the rounded value. */
function bytesParts(bytes: number): [string, 'GiB' | 'MiB'] {
  if (bytes === 0) {
    return ['0', 'MiB'];
  }
  if (Math.abs(bytes) >= GIB) {
    return [formatNumber(bytes / GIB), 'GiB'];
  }
  const mib = formatNumber(bytes / MIB);
  if (Math.abs(Number(mib)) >= 1024) {
    return [formatNumber(bytes / GIB), 'GiB'];
  }
  return [mib, 'MiB'];
}

/** "12.1 GiB", "630 MiB", "5.70 GiB"; "–" when unknown. */
export function formatBytes(bytes: number | null | undefined): string {
  if (!isNum(bytes)) {
    return UNKNOWN;
  }
  const [n, unit] = bytesParts(bytes);
  return `${n} ${unit}`;
}

/** The status bar's few characters: "12.1G", "630M". */
export function formatBytesShort(bytes: number | null | undefined): string {
  if (!isNum(bytes)) {
    return UNKNOWN;
  }
  const [n, unit] = bytesParts(bytes);
  return `${n}${unit[0]}`;
}

/** A rate in bytes per second: "1.20 GiB/s", "350 MiB/s"; "–" when unknown. */
export function formatRate(bytesPerSecond: number | null | undefined): string {
  return isNum(bytesPerSecond) ? `${formatBytes(bytesPerSecond)}/s` : UNKNOWN;
}

/** "used / total", each with its own unit: "5.70 GiB / 140 GiB", "630 MiB / 140 GiB". */
export function formatMemory(used: number | null | undefined, total: number | null | undefined): string {
  if (!isNum(used) && !isNum(total)) {
    return UNKNOWN;
  }
  return `${formatBytes(used)} / ${formatBytes(total)}`;
}

/** "5.71 / 140 GiB" when both are in the same unit, else as `formatMemory`: for narrow rows. */
export function formatMemoryShort(used: number | null | undefined, total: number | null | undefined): string {
  if (!isNum(used) || !isNum(total)) {
    return formatMemory(used, total);
  }
  const [u, unitU] = bytesParts(used);
  const [t, unitT] = bytesParts(total);
  return unitU === unitT ? `${u} / ${t} ${unitT}` : formatMemory(used, total);
}

/** "37%". */
export function formatPercent(value: number | null | undefined): string {
  return isNum(value) ? `${Math.round(value)}%` : UNKNOWN;
}

/** "39 °C". */
export function formatTemperature(celsius: number | null | undefined): string {
  return isNum(celsius) ? `${Math.round(celsius)} °C` : UNKNOWN;
}

/** "534 / 700 W", or "534 W" without a limit. */
export function formatPower(watts: number | null | undefined, limit: number | null | undefined): string {
  if (!isNum(watts)) {
    return UNKNOWN;
  }
  return isNum(limit) ? `${Math.round(watts)} / ${Math.round(limit)} W` : `${Math.round(watts)} W`;
}

/** "0.42 s", "3.91 s", "12.5 s". */
export function formatSeconds(seconds: number | null | undefined): string {
  return isNum(seconds) ? `${formatNumber(seconds)} s` : UNKNOWN;
}

/** "2 min", "90 s", "1 h": the length of the history a chart covers. */
export function formatSpan(seconds: number): string {
  if (seconds >= 3600 && seconds % 3600 === 0) {
    return `${seconds / 3600} h`;
  }
  if (seconds >= 120 && seconds % 60 === 0) {
    return `${seconds / 60} min`;
  }
  return `${Math.round(seconds)} s`;
}

/**
 * A chart's time axis, relative to the newest sample: "now", "−30 s", "−1 min", "−1.5 min".
 * A true minus sign (U+2212), which does not break a line and reads as "minus".
 */
export function formatAgo(seconds: number): string {
  const s = Math.abs(seconds);
  if (s < 0.5) {
    return 'now';
  }
  if (s >= 60 && s % 30 === 0) {
    return `−${Number((s / 60).toFixed(1))} min`;
  }
  return `−${Math.round(s)} s`;
}

const two = (n: number) => String(n).padStart(2, '0');

/** Local wall-clock time "14:03:21" (or "14:03" without seconds) of a moment in ms since the epoch. */
export function formatClock(ms: number, seconds = true): string {
  const d = new Date(ms);
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  return seconds ? `${hm}:${two(d.getSeconds())}` : hm;
}

/** How long, rounded down: "45 s", "12 min", "2 h 01 min"; "–" when unknown. */
export function formatDuration(seconds: number | null | undefined): string {
  if (!isNum(seconds) || seconds < 0) {
    return UNKNOWN;
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min`;
  }
  return `${Math.floor(s / 3600)} h ${two(Math.floor((s % 3600) / 60))} min`;
}

/** Memory used as a fraction 0..1 of the total; null when either is unknown. */
export function memoryFraction(used: number | null | undefined, total: number | null | undefined): number | null {
  if (!isNum(used) || !isNum(total) || total <= 0) {
    return null;
  }
  return Math.min(1, Math.max(0, used / total));
}

/** The last path component: "analysis/train.ipynb" → "train.ipynb". */
export function basename(path: string): string {
  const parts = path.split('/');
  return parts[parts.length - 1] || path;
}
