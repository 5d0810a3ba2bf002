import { describe, expect, it } from 'vitest';

import { DeviceHistory, historyCapacity, IHistoryPoint, RingBuffer } from '../src/history';
import { GIB, twoGpus } from './fixtures';

function point(t: number, utilization: number | null = 0): IHistoryPoint {
  return { t, utilization, memoryUsed: GIB, memoryTotal: 2 * GIB };
}

describe('RingBuffer', () => {
  it('keeps the newest items, oldest first', () => {
    const ring = new RingBuffer<number>(3);
    [1, 2, 3, 4, 5].forEach(i => ring.push(i));
    expect(ring.toArray()).toEqual([3, 4, 5]);
    expect(ring.length).toBe(3);
  });

  it('keeps the newest items when it shrinks and all when it grows', () => {
    const ring = new RingBuffer<number>(4);
    [1, 2, 3, 4, 5].forEach(i => ring.push(i));
    ring.resize(2);
    expect(ring.toArray()).toEqual([4, 5]);
    ring.resize(5);
    ring.push(6);
    expect(ring.toArray()).toEqual([4, 5, 6]);
    ring.clear();
    expect(ring.toArray()).toEqual([]);
  });
});

describe('DeviceHistory', () => {
  it('sizes itself from the history length and the refresh rate', () => {
    expect(historyCapacity(120, 1)).toBe(121);
    expect(historyCapacity(120, 0.5)).toBe(241);
    expect(historyCapacity(3600, 0.1)).toBe(3600);
    expect(historyCapacity(1, 10)).toBe(2);
  });

  it('keeps a window per GPU and drops repeated or older samples', () => {
    const h = new DeviceHistory(3, 1);
    for (let t = 1; t <= 6; t++) {
      h.add('GPU-a', point(t, t * 10));
    }
    h.add('GPU-a', point(6, 99)); // the same sample again
    h.add('GPU-a', point(2, 99)); // late
    expect(h.points('GPU-a').map(p => p.t)).toEqual([3, 4, 5, 6]);
    h.add('GPU-b', point(6));
    h.retain(['GPU-b']);
    expect(h.points('GPU-a')).toEqual([]);
    expect(h.points('GPU-b')).toHaveLength(1);
  });

  it('takes whole snapshots keyed by UUID, in bytes, and forgets GPUs that left', () => {
    const h = new DeviceHistory(120, 1);
    h.addSnapshot(twoGpus(100));
    h.addSnapshot(twoGpus(101));
    expect(h.points('GPU-aaaa')).toEqual([
      { t: 100, utilization: 37, memoryUsed: 12.1 * GIB, memoryTotal: 140.4 * GIB },
      { t: 101, utilization: 37, memoryUsed: 12.1 * GIB, memoryTotal: 140.4 * GIB }
    ]);
    const one = twoGpus(102);
    one.devices = one.devices.slice(0, 1);
    h.addSnapshot(one);
    expect(h.points('GPU-bbbb')).toEqual([]);
    // without a UUID, the CUDA ordinal names the GPU
    const bare = twoGpus(103);
    bare.devices[0].uuid = '';
    h.addSnapshot(bare);
    expect(h.points('cuda:0')).toHaveLength(1);
  });

  it('resizes every buffer when the settings change', () => {
    const h = new DeviceHistory(10, 1);
    for (let t = 1; t <= 11; t++) {
      h.add('x', point(t));
    }
    h.configure(2, 1);
    expect(h.capacity).toBe(3);
    expect(h.points('x').map(p => p.t)).toEqual([9, 10, 11]);
  });
});
