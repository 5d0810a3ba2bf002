import { describe, expect, it } from 'vitest';

import { DeviceHistory, historyCapacity, RingBuffer } from '../src/history';

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
      h.add('GPU-a', { t, utilization: t * 10, memory: 0.1 });
    }
    h.add('GPU-a', { t: 6, utilization: 99, memory: 0.1 }); // the same sample again
    h.add('GPU-a', { t: 2, utilization: 99, memory: 0.1 }); // late
    expect(h.points('GPU-a').map(p => p.t)).toEqual([3, 4, 5, 6]);
    h.add('GPU-b', { t: 6, utilization: 1, memory: null });
    h.retain(['GPU-b']);
    expect(h.points('GPU-a')).toEqual([]);
    expect(h.points('GPU-b')).toHaveLength(1);
  });

  it('resizes every buffer when the settings change', () => {
    const h = new DeviceHistory(10, 1);
    for (let t = 1; t <= 11; t++) {
      h.add('x', { t, utilization: 0, memory: 0 });
    }
    h.configure(2, 1);
    expect(h.capacity).toBe(3);
    expect(h.points('x').map(p => p.t)).toEqual([9, 10, 11]);
  });
});
