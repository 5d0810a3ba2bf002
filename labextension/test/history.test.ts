import { describe, expect, it } from 'vitest';

import { DeviceHistory, gapAfter, IHistoryPoint, Timeline } from '../src/history';
import { IHistoryMessage } from '../src/types';
import { GIB, twoGpus } from './fixtures';

function point(t: number, utilization: number | null = 0): IHistoryPoint {
  return { t, utilization, memoryUsed: GIB, memoryTotal: 2 * GIB };
}

const gap = (t: number): IHistoryPoint => ({ t, gap: true, utilization: null, memoryUsed: null, memoryTotal: null });

describe('Timeline', () => {
  it('keeps the last seconds behind the newest point, oldest first', () => {
    const line = new Timeline<IHistoryPoint>(3, gap);
    [1, 2, 3, 4, 5].forEach(t => line.add(point(t), 1));
    expect(line.points.map(p => p.t)).toEqual([2, 3, 4, 5]);
    expect(line.window(1).map(p => p.t)).toEqual([4, 5]);
    line.keep = 1;
    line.add(point(6), 1);
    expect(line.points.map(p => p.t)).toEqual([5, 6]);
  });

  it('puts a gap where a point comes later than the interval allows, and drops old ones', () => {
    const line = new Timeline<IHistoryPoint>(120, gap);
    line.add(point(10), 1);
    line.add(point(11), 1);
    expect(line.add(point(11), 1)).toBe(false); // the REST answer and the stream's first snapshot alike
    line.add(point(41), 1); // 30 s without a sample: a hung server
    expect(line.points.map(p => [p.t, !!p.gap])).toEqual([
      [10, false],
      [11, false],
      [12, true],
      [41, false]
    ]);
    expect(gapAfter(1)).toBe(3);
    expect(gapAfter(5)).toBe(12.5);
  });

  it("takes the server's rows over their span, with a gap where they meet older points", () => {
    const line = new Timeline<IHistoryPoint>(3600, gap);
    [100, 101, 102].forEach(t => line.add(point(t, 1), 1));
    // the server restarted: its history starts at 200
    line.merge([point(200, 5), point(201, 6)], 1);
    expect(line.points.map(p => [p.t, p.gap ? 'gap' : p.utilization])).toEqual([
      [100, 1],
      [101, 1],
      [102, 1],
      [103, 'gap'],
      [200, 5],
      [201, 6]
    ]);
    // the same span again, as a reconnect gets it: replaced, not doubled
    line.merge([point(101, 9), point(102, 9), point(200, 9)], 1);
    expect(line.points.map(p => p.t)).toEqual([100, 101, 102, 200, 201]);
    expect(line.points.filter(p => p.utilization === 9)).toHaveLength(3);
  });
});

describe('DeviceHistory', () => {
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

  it('takes whole snapshots keyed by UUID, in bytes, with what each notebook holds, and forgets GPUs that left', () => {
    const h = new DeviceHistory(120, 1);
    h.addSnapshot(twoGpus(100));
    h.addSnapshot(twoGpus(101));
    const fields = { utilization: 37, memoryUsed: 12.1 * GIB, memoryTotal: 140.4 * GIB, temperature: 29, power: 120.2 };
    expect(h.points('GPU-aaaa')).toEqual([
      { t: 100, ...fields, kernels: { 'k-123456789': 630 * 1024 ** 2 } },
      { t: 101, ...fields, kernels: { 'k-123456789': 630 * 1024 ** 2 } }
    ]);
    expect(h.labels.get('k-123456789')).toBe('train.ipynb');
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

  it('forgets no GPU for a snapshot that could not read them (one NVML error wiped every chart)', () => {
    const h = new DeviceHistory(120, 1);
    for (let t = 100; t < 130; t++) {
      h.addSnapshot(twoGpus(t));
    }
    h.addSnapshot({ gpu: false, reason: 'NVML: Unknown Error', time: 130, devices: [] });
    h.addSnapshot(twoGpus(131));
    expect(h.points('GPU-aaaa').length).toBeGreaterThan(30);
    expect(h.points('GPU-bbbb').length).toBeGreaterThan(30);
  });

  it('keeps the panel\'s span, or the dashboard\'s hour while one is open', () => {
    const h = new DeviceHistory(10, 1);
    for (let t = 1; t <= 30; t++) {
      h.add('x', point(t));
    }
    expect(h.points('x').map(p => p.t)).toEqual([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]);
    h.configure(2, 1);
    expect(h.points('x').map(p => p.t)).toEqual([28, 29, 30]);
    h.keepAtLeast(3600);
    for (let t = 31; t <= 100; t++) {
      h.add('x', point(t));
    }
    expect(h.points('x', 3600)).toHaveLength(73); // 28..100
    expect(h.points('x')).toHaveLength(3); // the panel still draws its two seconds
  });

  it("merges the server's history message: gaps, notebooks' memory, links and the host", () => {
    const h = new DeviceHistory(120, 1);
    const message: IHistoryMessage = {
      type: 'history',
      time: 205,
      seconds: 120,
      fine_step: 1,
      coarse_step: 10,
      gpus: {
        'GPU-aaaa': {
          t: [200, 201, 202, 203],
          utilization: [10, null, null, 30],
          memory_used: [GIB, null, null, 2 * GIB],
          memory_total: [8 * GIB, null, null, 8 * GIB],
          temperature: [40, null, null, 41],
          power_w: [100, null, null, 110],
          kernels: { k1: [GIB, null, null, null] }
        }
      },
      links: { 'GPU-aaaa': { t: [200], pcie_tx: [1e9], pcie_rx: [2e9], nvlink_tx: [null], nvlink_rx: [null] } },
      host: { t: [200, 202], cpu_percent: [12.5, 30], memory_used: [4 * GIB, 5 * GIB], memory_total: [16 * GIB, 16 * GIB] },
      labels: { k1: 'train.ipynb' }
    };
    h.merge(message);
    const pts = h.points('GPU-aaaa');
    expect(pts.map(p => [p.t, p.gap ? 'gap' : p.utilization])).toEqual([
      [200, 10],
      [201, 'gap'],
      [202, 'gap'],
      [203, 30]
    ]);
    expect(pts[0].kernels).toEqual({ k1: GIB });
    expect(h.labels.get('k1')).toBe('train.ipynb');
    expect(h.linkPoints('GPU-aaaa', 120)).toEqual([{ t: 200, pcieTx: 1e9, pcieRx: 2e9, nvlinkTx: null, nvlinkRx: null }]);
    expect(h.hostPoints(120).map(p => p.cpu)).toEqual([12.5, 30]);
    // the stream's snapshots carry on after it
    h.addSnapshot(twoGpus(204));
    expect(h.points('GPU-aaaa').map(p => p.t)).toEqual([200, 201, 202, 203, 204]);
  });
});
