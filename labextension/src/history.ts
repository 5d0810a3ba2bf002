/**
 * What the charts draw: per GPU (keyed by `deviceKey`) its utilisation, memory and each
 * notebook's share of it, temperature and power; per GPU its link throughput; the host's CPU and
 * memory — each a timeline of points oldest first, kept for the longest span a view shows.
 *
 * Filled from two sides: the server's history (the stream's first message: the last minutes at
 * once, with its gaps) and then every snapshot. Where nothing was sampled — no page watched, the
 * server stopped or restarted, the stream was down — a timeline holds a gap marker, a point whose
 * values are all null, so that a chart draws a gap and its hover says "no sample".
 */
import { kernelLabel } from './model';
import { deviceKey, IHistoryColumns, IHistoryMessage, ISnapshot } from './types';

/** Two points further apart than this (and than 2.5 sampling intervals) have a gap between them. */
export const GAP_MIN_S = 3;

export function gapAfter(intervalSeconds: number): number {
  return Math.max(GAP_MIN_S, 2.5 * (intervalSeconds > 0 ? intervalSeconds : 1));
}

interface ITimed {
  t: number;
  /** Nothing was sampled here: every value is null. */
  gap?: boolean;
}

/** One sample of one GPU: time in seconds since the epoch, utilisation 0..100, memory in bytes. */
export interface IHistoryPoint extends ITimed {
  utilization: number | null;
  memoryUsed: number | null;
  memoryTotal: number | null;
  temperature?: number | null;
  power?: number | null;
  /** Bytes of this GPU's memory per kernel id (NVML's figure for the kernel's processes). */
  kernels?: Record<string, number> | null;
}

/** One reading of a GPU's links, bytes/s. */
export interface ILinkPoint extends ITimed {
  pcieTx: number | null;
  pcieRx: number | null;
  nvlinkTx: number | null;
  nvlinkRx: number | null;
}

/** The host's CPU (percent of all cores) and memory, bytes. */
export interface IHostPoint extends ITimed {
  cpu: number | null;
  memoryUsed: number | null;
  memoryTotal: number | null;
}

/** Points oldest first, at most `keep` seconds behind the newest. */
export class Timeline<T extends ITimed> {
  constructor(
    keep: number,
    private _gap: (t: number) => T
  ) {
    this._keep = keep;
  }

  /** Seconds kept behind the newest point. */
  get keep(): number {
    return this._keep;
  }

  set keep(seconds: number) {
    this._keep = seconds;
    this._trim();
  }

  get points(): readonly T[] {
    return this._points;
  }

  get newest(): number | null {
    return this._points.length ? this._points[this._points.length - 1].t : null;
  }

  /**
   * A live point, `interval` seconds after the last one as the stream goes; one that is not
   * newer than the last is dropped (the REST answer and the stream's first snapshot alike).
   */
  add(point: T, interval: number): boolean {
    const last = this.newest;
    if (last !== null && point.t <= last) {
      return false;
    }
    if (last !== null && point.t - last > gapAfter(interval)) {
      this._points.push(this._gap(last + Math.min(interval, (point.t - last) / 2)));
    }
    this._points.push(point);
    this._trim();
    return true;
  }

  /**
   * The server's rows over their time span: they replace what this holds there (the server saw
   * the samples this page missed), and where they meet older points with nothing known between,
   * a gap marker goes between. `spacing`: the seconds the server's rows are apart at most.
   */
  merge(rows: T[], spacing: number): void {
    if (!rows.length) {
      return;
    }
    const first = rows[0].t;
    const last = rows[rows.length - 1].t;
    const before = this._points.filter(p => p.t < first);
    const after = this._points.filter(p => p.t > last);
    const merged = [...before];
    const boundary = before.length ? before[before.length - 1] : null;
    if (boundary && !boundary.gap && !rows[0].gap && first - boundary.t > gapAfter(spacing)) {
      merged.push(this._gap(boundary.t + Math.min(spacing, (first - boundary.t) / 2)));
    }
    merged.push(...rows);
    if (after.length && !after[0].gap && after[0].t - last > gapAfter(spacing)) {
      merged.push(this._gap(last + Math.min(spacing, (after[0].t - last) / 2)));
    }
    merged.push(...after);
    this._points = merged;
    this._trim();
  }

  /** The points of the last `seconds` before the newest. */
  window(seconds: number): T[] {
    const newest = this.newest;
    if (newest === null) {
      return [];
    }
    const from = newest - seconds;
    let lo = 0;
    let hi = this._points.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this._points[mid].t < from) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return this._points.slice(lo);
  }

  private _trim(): void {
    const newest = this.newest;
    if (newest === null) {
      return;
    }
    let drop = 0;
    while (drop < this._points.length && this._points[drop].t < newest - this._keep) {
      drop++;
    }
    if (drop > 0) {
      this._points.splice(0, drop);
    }
  }

  private _keep: number;
  private _points: T[] = [];
}

function numOrNull(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

const gpuGap = (t: number): IHistoryPoint => ({ t, gap: true, utilization: null, memoryUsed: null, memoryTotal: null });
const linkGap = (t: number): ILinkPoint => ({ t, gap: true, pcieTx: null, pcieRx: null, nvlinkTx: null, nvlinkRx: null });
const hostGap = (t: number): IHostPoint => ({ t, gap: true, cpu: null, memoryUsed: null, memoryTotal: null });

/** The server's columns as rows: `make(i)` builds row i; a row with no value is a gap. */
function rows<T extends ITimed>(columns: IHistoryColumns | undefined, fields: string[], make: (i: number) => T): T[] {
  if (!columns || !Array.isArray(columns.t)) {
    return [];
  }
  return columns.t.map((t, i) => {
    const row = make(i);
    const values = fields.map(f => (columns[f] as (number | null)[] | undefined)?.[i] ?? null);
    return values.every(v => v === null) ? { ...row, gap: true } : row;
  });
}

function column(columns: IHistoryColumns, field: string, i: number): number | null {
  return numOrNull((columns[field] as (number | null)[] | undefined)?.[i]);
}

/** Every GPU's timeline (and its links'), the host's, and what the charts call each kernel. */
export class DeviceHistory {
  constructor(historySeconds: number, intervalSeconds: number) {
    this._span = historySeconds;
    this._interval = intervalSeconds > 0 ? intervalSeconds : 1;
    this.host = new Timeline<IHostPoint>(this.keep, hostGap);
  }

  /** The host's CPU and memory. */
  readonly host: Timeline<IHostPoint>;

  /** Kernel id -> "train.ipynb": the names of the notebooks in the per-notebook memory. */
  readonly labels = new Map<string, string>();

  /** Seconds kept: the panel's span, or the dashboard's longest while one is open. */
  get keep(): number {
    return Math.max(this._span, this._extra);
  }

  /** The panel's span, and the stream's interval (what a gap is measured against). */
  configure(historySeconds: number, intervalSeconds: number): void {
    this._span = historySeconds;
    if (intervalSeconds > 0) {
      this._interval = intervalSeconds;
    }
    this._resize();
  }

  /** The interval the server granted (it clamps what was asked). */
  setInterval(intervalSeconds: number): void {
    if (intervalSeconds > 0) {
      this._interval = intervalSeconds;
    }
  }

  /** Keep at least `seconds` besides the panel's span (the dashboard's longest range; 0: none). */
  keepAtLeast(seconds: number): void {
    this._extra = Math.max(0, seconds);
    this._resize();
  }

  add(key: string, point: IHistoryPoint): void {
    this._gpu(key).add(point, this._interval);
  }

  /** Every GPU of a snapshot, its links and the host; GPUs it no longer lists are forgotten. */
  addSnapshot(snapshot: ISnapshot): void {
    const devices = snapshot.devices ?? [];
    for (const d of devices) {
      const key = deviceKey(d);
      const kernels: Record<string, number> = {};
      for (const p of d.processes ?? []) {
        const used = numOrNull(p.used_memory);
        if (p.kernel && used !== null) {
          kernels[p.kernel.id] = (kernels[p.kernel.id] ?? 0) + used;
          this.labels.set(p.kernel.id, kernelLabel(p.kernel));
        }
      }
      this.add(key, {
        t: snapshot.time,
        utilization: numOrNull(d.utilization),
        memoryUsed: numOrNull(d.memory_used),
        memoryTotal: numOrNull(d.memory_total),
        temperature: numOrNull(d.temperature),
        power: numOrNull(d.power_w),
        kernels
      });
      const links = d.links;
      const read = numOrNull(links?.time);
      if (links && read !== null) {
        this._link(key).add(
          {
            t: read,
            pcieTx: numOrNull(links.pcie_tx),
            pcieRx: numOrNull(links.pcie_rx),
            nvlinkTx: numOrNull(links.nvlink_tx),
            nvlinkRx: numOrNull(links.nvlink_rx)
          },
          numOrNull(snapshot.links_status?.interval) ?? 5
        );
      }
    }
    const host = snapshot.host;
    const read = numOrNull(host?.time);
    if (host && read !== null) {
      this.host.add(
        { t: read, cpu: numOrNull(host.cpu_percent), memoryUsed: numOrNull(host.memory_used), memoryTotal: numOrNull(host.memory_total) },
        numOrNull(host.interval) ?? 2
      );
    }
    if (snapshot.gpu) {
      this.retain(devices.map(deviceKey)); // (a snapshot that could not read the GPUs forgets none)
    }
  }

  /** The server's history (the stream's first message, or GET /gpuctx/api/history). */
  merge(message: IHistoryMessage): void {
    for (const [kernel, label] of Object.entries(message.labels ?? {})) {
      this.labels.set(kernel, label);
    }
    const fine = numOrNull(message.fine_step) ?? 1;
    const coarse = numOrNull(message.coarse_step) ?? 10;
    for (const [key, c] of Object.entries(message.gpus ?? {})) {
      const kernels = (c.kernels ?? {}) as Record<string, (number | null)[]>;
      const gpu = rows<IHistoryPoint>(c, ['utilization', 'memory_used', 'temperature', 'power_w'], i => {
        const held: Record<string, number> = {};
        for (const [kernel, values] of Object.entries(kernels)) {
          const used = numOrNull(values[i]);
          if (used !== null) {
            held[kernel] = used;
          }
        }
        return {
          t: c.t[i],
          utilization: column(c, 'utilization', i),
          memoryUsed: column(c, 'memory_used', i),
          memoryTotal: column(c, 'memory_total', i),
          temperature: column(c, 'temperature', i),
          power: column(c, 'power_w', i),
          kernels: held
        };
      });
      this._gpu(key).merge(gpu.map(p => (p.gap ? gpuGap(p.t) : p)), Math.max(fine, spacing(gpu, coarse)));
    }
    for (const [key, c] of Object.entries(message.links ?? {})) {
      const link = rows<ILinkPoint>(c, ['pcie_tx', 'pcie_rx', 'nvlink_tx', 'nvlink_rx'], i => ({
        t: c.t[i],
        pcieTx: column(c, 'pcie_tx', i),
        pcieRx: column(c, 'pcie_rx', i),
        nvlinkTx: column(c, 'nvlink_tx', i),
        nvlinkRx: column(c, 'nvlink_rx', i)
      }));
      this._link(key).merge(link, Math.max(5, spacing(link, coarse)));
    }
    const h = message.host;
    if (h) {
      const host = rows<IHostPoint>(h, ['cpu_percent', 'memory_used'], i => ({
        t: h.t[i],
        cpu: column(h, 'cpu_percent', i),
        memoryUsed: column(h, 'memory_used', i),
        memoryTotal: column(h, 'memory_total', i)
      }));
      this.host.merge(host, Math.max(2, spacing(host, coarse)));
    }
  }

  /** The last `seconds` of a GPU (the panel's span when not given). */
  points(key: string, seconds?: number): IHistoryPoint[] {
    return this._gpus.get(key)?.window(seconds ?? this._span) ?? [];
  }

  linkPoints(key: string, seconds: number): ILinkPoint[] {
    return this._links.get(key)?.window(seconds) ?? [];
  }

  hostPoints(seconds: number): IHostPoint[] {
    return this.host.window(seconds);
  }

  /** Forget GPUs that are no longer in the snapshot. */
  retain(keys: Iterable<string>): void {
    const keep = new Set(keys);
    for (const map of [this._gpus, this._links] as Map<string, unknown>[]) {
      for (const key of Array.from(map.keys())) {
        if (!keep.has(key)) {
          map.delete(key);
        }
      }
    }
  }

  clear(): void {
    this._gpus.clear();
    this._links.clear();
  }

  private _gpu(key: string): Timeline<IHistoryPoint> {
    let timeline = this._gpus.get(key);
    if (!timeline) {
      timeline = new Timeline<IHistoryPoint>(this.keep, gpuGap);
      this._gpus.set(key, timeline);
    }
    return timeline;
  }

  private _link(key: string): Timeline<ILinkPoint> {
    let timeline = this._links.get(key);
    if (!timeline) {
      timeline = new Timeline<ILinkPoint>(this.keep, linkGap);
      this._links.set(key, timeline);
    }
    return timeline;
  }

  private _resize(): void {
    for (const timeline of [...this._gpus.values(), ...this._links.values(), this.host] as Timeline<ITimed>[]) {
      timeline.keep = this.keep;
    }
  }

  private _span: number;
  private _extra = 0;
  private _interval: number;
  private _gpus = new Map<string, Timeline<IHistoryPoint>>();
  private _links = new Map<string, Timeline<ILinkPoint>>();
}

/** The widest spacing between neighbouring rows that hold values (coarse rows are 10 s apart). */
function spacing(points: ITimed[], fallback: number): number {
  let widest = 0;
  for (let i = 1; i < points.length; i++) {
    if (!points[i].gap && !points[i - 1].gap) {
      widest = Math.max(widest, points[i].t - points[i - 1].t);
    }
  }
  return points.length > 1 ? Math.min(widest || fallback, fallback) : fallback;
}
