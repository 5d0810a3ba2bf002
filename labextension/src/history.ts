/**
 * The last minutes of utilisation and memory per GPU, for the sparklines: a fixed-size ring
 * buffer per device, sized from the history length and the refresh rate.
 */

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

/** One sample of one GPU: time in seconds, utilisation 0..100, memory used 0..1. */
export interface IHistoryPoint {
  t: number;
  utilization: number | null;
  memory: number | null;
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
