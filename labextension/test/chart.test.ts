// @vitest-environment jsdom
/**
 * The chart's data, axes and legend. jsdom has neither layout nor a canvas, so uPlot is replaced
 * by a fake that records what it was given; the real one draws in the browser tests.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { chartData, HistoryChart, memoryAxisMax, timeSplits } from '../src/chart';
import { IHistoryPoint } from '../src/history';

// The fake is made before the imports run (vi.mock is hoisted above them).
const { FakePlot, made } = vi.hoisted(() => {
  const made: any[] = []; // eslint-disable-line @typescript-eslint/no-explicit-any
  class FakePlot {
    width: number;
    data: unknown[];
    cursor: { idx: number | null; left?: number } = { idx: null };
    destroyed = false;
    constructor(
      public opts: any, // eslint-disable-line @typescript-eslint/no-explicit-any
      data: unknown[],
      public target: HTMLElement
    ) {
      this.width = opts.width;
      this.data = data;
      made.push(this);
    }
    setData(data: unknown[]): void {
      this.data = data;
    }
    setSize({ width }: { width: number }): void {
      this.width = width;
    }
    redraw(): void {}
    destroy(): void {
      this.destroyed = true;
    }
    /** x per pixel: the fake's plot spans x -120..0 over 120 px. */
    posToVal(left: number): number {
      return left - 120;
    }
    /** What a pointer over sample `idx` (at pixel `left`, when given) makes uPlot do. */
    hover(idx: number | null, left?: number): void {
      this.cursor.idx = idx;
      this.cursor.left = left;
      for (const hook of this.opts.hooks.setCursor) {
        hook(this);
      }
    }
  }
  return { FakePlot, made };
});
type FakePlot = InstanceType<typeof FakePlot>;

vi.mock('uplot', () => ({ default: FakePlot }));

const GIB = 1024 ** 3;

function points(n: number, t0 = 1000): IHistoryPoint[] {
  return Array.from({ length: n }, (_, i) => ({
    t: t0 + i,
    utilization: i * 10,
    memoryUsed: (i + 1) * GIB,
    memoryTotal: 140 * GIB
  }));
}

/** jsdom lays nothing out: give the plot area a width, as a browser would. */
function withWidth(chart: HistoryChart, width: number): void {
  const plot = chart.node.querySelector('.jp-gpuctx-chart-plot') as HTMLElement;
  Object.defineProperty(plot, 'clientWidth', { configurable: true, get: () => width });
}

describe('chart data and axes', () => {
  it('puts the newest sample at 0 and older ones before it, memory in bytes', () => {
    expect(chartData(points(3))).toEqual({
      x: [-2, -1, 0],
      utilization: [0, 10, 20],
      memory: [GIB, 2 * GIB, 3 * GIB],
      newest: 1002
    });
    expect(chartData([])).toEqual({ x: [], utilization: [], memory: [], newest: null });
  });

  it("scales memory to the GPU's total, or to the peak seen when asked", () => {
    expect(memoryAxisMax(points(3), 'total')).toBe(140 * GIB);
    expect(memoryAxisMax(points(3), 'peak')).toBe(3 * GIB);
    const idle = points(2).map(p => ({ ...p, memoryUsed: 0, memoryTotal: null }));
    expect(memoryAxisMax(idle, 'total')).toBe(1024 ** 2); // no total known: the peak, at least 1 MiB
    expect(memoryAxisMax([], 'peak')).toBeNull();
  });

  it('labels the time axis in round steps back from now, as many as fit', () => {
    expect(timeSplits(120, 150)).toEqual([-120, -60, 0]);
    expect(timeSplits(120, 400)).toEqual([-120, -90, -60, -30, 0]);
    expect(timeSplits(3600, 150)).toEqual([-3600, -1800, 0]);
    expect(timeSplits(45, 60)).toEqual([0]); // no room: "now", and the legend gives the span
  });
});

describe('HistoryChart', () => {
  beforeEach(() => {
    made.length = 0;
  });
  afterEach(() => {
    document.body.replaceChildren();
  });

  it('waits for a width before it draws, and says how many samples it holds', async () => {
    const chart = new HistoryChart();
    document.body.appendChild(chart.node);
    chart.update(points(3), 120, 'total', 'Utilisation and memory of cuda:0 over the last 2 min');
    expect(made).toHaveLength(0); // a hidden panel has no width
    expect(chart.node.dataset.gpuctxPoints).toBe('3');
    expect(chart.node.querySelector('[role="img"]')!.getAttribute('aria-label')).toContain('over the last 2 min');
    withWidth(chart, 220);
    await chart.fit();
    expect(made).toHaveLength(1);
    expect(made[0].width).toBe(220);
    expect(made[0].data).toEqual([[-2, -1, 0], [0, 10, 20], [GIB, 2 * GIB, 3 * GIB]]);
    chart.update(points(4), 120, 'total', 'x');
    await chart.fit();
    expect(made).toHaveLength(1); // updated, not rebuilt
    expect((made[0].data[0] as number[]).length).toBe(4);
    withWidth(chart, 180);
    await chart.fit();
    expect(made[0].width).toBe(180);
    chart.dispose();
    expect(made[0].destroyed).toBe(true);
  });

  it('labels 0–100 % on the left and 0–total on the right, with the time span below', async () => {
    const chart = new HistoryChart();
    withWidth(chart, 220);
    chart.update(points(3), 120, 'total', 'x');
    await chart.fit();
    const opts = made[0].opts;
    const [x, pct, mem] = opts.axes;
    expect(pct.values(null, pct.splits())).toEqual(['0%', '50%', '100%']);
    expect(mem.values(null, mem.splits())).toEqual(['0', '70.0 GiB', '140 GiB']);
    expect(x.values(null, [-120, -60, 0])).toEqual(['−2 min', '−1 min', 'now']);
    expect(opts.scales.x.range()).toEqual([-120, 0]);
    expect(opts.scales.pct.range()).toEqual([0, 100]);
    chart.update(points(3), 120, 'peak', 'x');
    expect(opts.scales.mem.range()).toEqual([0, 3 * GIB]);
    expect(chart.node.dataset.gpuctxMemoryScale).toBe('peak');
    chart.dispose();
  });

  it('reads its colours from the theme each time it draws', async () => {
    const chart = new HistoryChart();
    document.body.appendChild(chart.node);
    withWidth(chart, 220);
    chart.update(points(2), 120, 'total', 'x');
    await chart.fit();
    const [, util, mem] = made[0].opts.series;
    chart.node.style.setProperty('--gpuctx-util-color', '#123456');
    chart.node.style.setProperty('--gpuctx-memory-color', '#654321');
    expect(util.stroke()).toBe('#123456');
    expect(mem.stroke()).toBe('#654321');
    chart.node.style.setProperty('--gpuctx-util-color', '#abcdef'); // the dark theme, say
    expect(util.stroke()).toBe('#abcdef');
    chart.dispose();
  });

  it('shows the newest values in its legend, and the values under the pointer on hover', async () => {
    const chart = new HistoryChart();
    withWidth(chart, 220);
    chart.update(points(3, Date.UTC(2025, 0, 1) / 1000), 120, 'total', 'x');
    await chart.fit();
    const legend = chart.node.querySelector('.jp-gpuctx-legend')!;
    const value = (kind: string) => legend.querySelector(`.jp-gpuctx-legend-${kind} .jp-gpuctx-legend-value`)!.textContent;
    expect(value('utilization')).toBe('20%');
    expect(value('memory')).toBe('3.00 GiB');
    expect(legend.querySelector('.jp-gpuctx-legend-time')!.textContent).toBe('last 2 min');
    made[0].hover(0);
    expect(value('utilization')).toBe('0%');
    expect(value('memory')).toBe('1.00 GiB');
    expect(legend.querySelector('.jp-gpuctx-legend-time')!.textContent).toMatch(/^\d\d:\d\d:\d\d$/);
    made[0].hover(null);
    expect(value('utilization')).toBe('20%');
    chart.dispose();
  });

  it('draws a gap as a gap, and says "no sample" with the time when the pointer is inside one', async () => {
    const chart = new HistoryChart();
    withWidth(chart, 220);
    const t0 = Date.UTC(2025, 0, 1) / 1000;
    const pts: IHistoryPoint[] = [
      ...points(3, t0),
      { t: t0 + 3, gap: true, utilization: null, memoryUsed: null, memoryTotal: null },
      ...points(3, t0 + 40)
    ];
    chart.update(pts, 120, 'total', 'x', 3);
    await chart.fit();
    expect(made[0].data[1]).toEqual([0, 10, 20, null, 0, 10, 20]); // uPlot breaks the line at null
    expect(chart.node.dataset.gpuctxGaps).toBe('1');
    const legend = chart.node.querySelector('.jp-gpuctx-legend')!;
    const value = () => legend.querySelector('.jp-gpuctx-legend-utilization .jp-gpuctx-legend-value')!.textContent;
    made[0].hover(3); // on the gap marker
    expect(value()).toBe('no sample');
    // x of the points: -42..-40, the gap at -39, then -2..0; the pointer at -20, 18 s from the gap
    // marker that uPlot snaps to and 20 s from the nearest sample: no sample there either
    made[0].hover(3, 100);
    expect(value()).toBe('no sample');
    expect(legend.querySelector('.jp-gpuctx-legend-time')!.textContent).toMatch(/^\d\d:\d\d:\d\d$/);
    made[0].hover(6, 120); // on the newest sample
    expect(value()).toBe('20%');
    chart.dispose();
  });

  it("reads the nearest sample's value between samples however far apart (the server's 10 s rows)", async () => {
    const chart = new HistoryChart();
    withWidth(chart, 220);
    const t0 = Date.UTC(2025, 0, 1) / 1000;
    const pts: IHistoryPoint[] = [0, 10, 20, 30].map((dt, k) => ({
      t: t0 + dt, utilization: 10 * k, memoryUsed: GIB, memoryTotal: 2 * GIB
    }));
    chart.update(pts, 3600, 'total', 'x', 3);
    await chart.fit();
    const legend = chart.node.querySelector('.jp-gpuctx-legend')!;
    const value = () => legend.querySelector('.jp-gpuctx-legend-utilization .jp-gpuctx-legend-value')!.textContent;
    made[0].hover(1, 104); // 16 s before the newest: 4 s from the nearest sample, on the line to the next
    expect(value()).toBe('10%');
    chart.dispose();
  });
});
