/**
 * The last minutes of utilisation and memory per GPU, for the charts: a fixed-size ring buffer
 * per device (keyed by `deviceKey`), sized from the history length and the refresh rate.
 */
import { deviceKey, ISnapshot } from './types';

export class RingBuffer<T> {
  private _items: (T | undefined)[];
  private _start = 0;
  private _length = 0;

  constructor(capacity: number) {
    this._items = new Array(Math.max(1, Math.floor(capacity)));
  }

  get capacity(): number {
    return this._items.length;
  }

  get length(): number {
    return this._length;
  }

  push(item: T): void {
    const cap = this._items.length;
    if (this._length < cap) {
      this._items[(this._start + this._length) % cap] = item;
      this._length++;
    } else {
      this._items[this._start] = item;
      this._start = (this._start + 1) % cap;
    }
  }

  /** Oldest first. */
  toArray(): T[] {
    const out: T[] = [];
    const cap = this._items.length;
    for (let i = 0; i < this._length; i++) {
      out.push(this._items[(this._start + i) % cap] as T);
    }
    return out;
  }

  /** The newest `capacity` items survive a resize, oldest first. */
  resize(capacity: number): void {
    const kept = this.toArray().slice(-Math.max(1, Math.floor(capacity)));
    this._items = new Array(Math.max(1, Math.floor(capacity)));
    this._start = 0;
    this._length = 0;
    kept.forEach(item => this.push(item));
  }

  clear(): void {
    this._start = 0;
    this._length = 0;
    this._items.fill(undefined);
  }
}

/** One sample of one GPU: time in seconds since the epoch, utilisation 0..100, memory in bytes. */
export interface IHistoryPoint {
  t: number;
  utilization: number | null;
  memoryUsed: number | null;
  memoryTotal: number | null;
}

function numOrNull(v: number | null | undefined): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** Samples to keep for `historySeconds` at one sample every `intervalSeconds` (at most 3600). */
export function historyCapacity(historySeconds: number, intervalSeconds: number): number {
  const interval = intervalSeconds > 0 ? intervalSeconds : 1;
  return Math.min(3600, Math.max(2, Math.ceil(historySeconds / interval) + 1));
}

/** Per-GPU history keyed by UUID; a sample older than the newest one kept is dropped. */
export class DeviceHistory {
  private _buffers = new Map<string, RingBuffer<IHistoryPoint>>();
  private _capacity: number;

  constructor(historySeconds: number, intervalSeconds: number) {
    this._capacity = historyCapacity(historySeconds, intervalSeconds);
  }

  get capacity(): number {
    return this._capacity;
  }

  configure(historySeconds: number, intervalSeconds: number): void {
    this._capacity = historyCapacity(historySeconds, intervalSeconds);
    this._buffers.forEach(buffer => buffer.resize(this._capacity));
  }

  add(key: string, point: IHistoryPoint): void {
    let buffer = this._buffers.get(key);
    if (!buffer) {
      buffer = new RingBuffer<IHistoryPoint>(this._capacity);
      this._buffers.set(key, buffer);
    }
    const items = buffer.toArray();
    const last = items[items.length - 1];
    if (last && point.t <= last.t) {
      return; // the same sample twice (REST answer and stream), or one out of order
    }
    buffer.push(point);
  }

  /** Every GPU of a snapshot, and forget the GPUs it no longer lists. */
  addSnapshot(snapshot: ISnapshot): void {
    const devices = snapshot.devices ?? [];
    for (const d of devices) {
      this.add(deviceKey(d), {
        t: snapshot.time,
        utilization: numOrNull(d.utilization),
        memoryUsed: numOrNull(d.memory_used),
        memoryTotal: numOrNull(d.memory_total)
      });
    }
    this.retain(devices.map(deviceKey));
  }

  points(key: string): IHistoryPoint[] {
    return this._buffers.get(key)?.toArray() ?? [];
  }

  /** Forget GPUs that are no longer in the snapshot. */
  retain(keys: Iterable<string>): void {
    const keep = new Set(keys);
    for (const key of Array.from(this._buffers.keys())) {
      if (!keep.has(key)) {
        this._buffers.delete(key);
      }
    }
  }

  clear(): void {
    this._buffers.clear();
  }
}
