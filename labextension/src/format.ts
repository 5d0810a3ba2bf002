/** Number formatting shared by the panel and the status bar: short, fixed units, no surprises. */

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

function isNum(v: number | null | undefined): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

function scaled(bytes: number | null | undefined, gib: string, mib: string): string {
  if (!isNum(bytes)) {
    return '–';
  }
  if (Math.abs(bytes) >= GIB) {
    return `${(bytes / GIB).toFixed(1)}${gib}`;
  }
  return `${Math.round(bytes / MIB)}${mib}`;
}

/** "12.1 GiB", "630 MiB"; "–" when unknown. */
export function formatBytes(bytes: number | null | undefined): string {
  return scaled(bytes, ' GiB', ' MiB');
}

/** The status bar's few characters: "12.1G", "630M". */
export function formatBytesShort(bytes: number | null | undefined): string {
  return scaled(bytes, 'G', 'M');
}

/** "used / total" in GiB with one decimal, the way nvidia-smi users read it. */
export function formatMemory(used: number | null | undefined, total: number | null | undefined): string {
  if (!isNum(used) && !isNum(total)) {
    return '–';
  }
  return `${formatBytes(used)} / ${formatBytes(total)}`;
}

export function formatPercent(value: number | null | undefined): string {
  return isNum(value) ? `${Math.round(value)}%` : '–';
}

export function formatTemperature(celsius: number | null | undefined): string {
  return isNum(celsius) ? `${Math.round(celsius)} °C` : '–';
}

export function formatPower(watts: number | null | undefined, limit: number | null | undefined): string {
  if (!isNum(watts)) {
    return '–';
  }
  return isNum(limit) ? `${Math.round(watts)} / ${Math.round(limit)} W` : `${Math.round(watts)} W`;
}

/** Seconds as "0.42 s" or "3.1 s". */
export function formatSeconds(seconds: number | null | undefined): string {
  if (!isNum(seconds)) {
    return '–';
  }
  return seconds < 1 ? `${seconds.toFixed(2)} s` : `${seconds.toFixed(1)} s`;
}

/** "2 min", "90 s": the length of the history a sparkline covers. */
export function formatSpan(seconds: number): string {
  if (seconds >= 120 && seconds % 60 === 0) {
    return `${seconds / 60} min`;
  }
  return `${Math.round(seconds)} s`;
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
