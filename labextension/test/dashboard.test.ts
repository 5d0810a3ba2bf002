// @vitest-environment jsdom
/**
 * The GPU dashboard's data (memory stacked by notebook, links, host) and its DOM: a section per
 * GPU, the time range and memory-axis buttons, the GPU picker, and the line that says why there
 * is no link throughput. uPlot is a fake here (jsdom has no canvas); the browser tests draw it.
 */
import { Widget } from '@lumino/widgets';
import { describe, expect, it, vi } from 'vitest';

import { GpuDashboard, hostChart, linksChart, memoryChart } from '../src/dashboard';
import { DeviceHistory, IHistoryPoint } from '../src/history';
import { GIB, twoGpus } from './fixtures';

const livePlots = new Set<object>(); // uPlot keeps every plot not destroyed for the page's life

vi.mock('uplot', () => ({
  default: class {
    constructor() {
      livePlots.add(this);
    }
    setData(): void {}
    setSize(): void {}
    redraw(): void {}
    destroy(): void {
      livePlots.delete(this);
    }
  }
}));

function pt(t: number, used: number | null, kernels: Record<string, number>): IHistoryPoint {
  return { t, utilization: 50, memoryUsed: used, memoryTotal: 100 * GIB, kernels };
}

describe('memoryChart', () => {
  it("stacks each notebook's memory, largest first, then what others hold, up to the memory in use", () => {
    const labels = new Map([
      ['k1', 'train.ipynb'],
      ['k2', 'eval.ipynb']
    ]);
    const points = [pt(10, 10 * GIB, { k1: 4 * GIB, k2: 1 * GIB }), pt(11, 12 * GIB, { k1: 4 * GIB, k2: 3 * GIB })];
    const chart = memoryChart(points, 11, labels, 'total');
    expect(chart.series.map(s => s.label)).toEqual(['train.ipynb', 'eval.ipynb', 'Other processes']);
    expect(chart.series.every(s => s.stacked)).toBe(true);
    expect(chart.x).toEqual([-1, 0]);
    expect(chart.legend).toEqual([
      [4 * GIB, 4 * GIB],
      [1 * GIB, 3 * GIB],
      [5 * GIB, 5 * GIB]
    ]);
    expect(chart.y).toEqual([
      [4 * GIB, 4 * GIB],
      [5 * GIB, 7 * GIB],
      [10 * GIB, 12 * GIB] // the top of the stack is the memory in use
    ]);
    expect(chart.ranges).toEqual({ mem: [0, 100 * GIB] });
    // a few GiB on a 140 GiB axis is a line at 0: 'peak' scales to the memory in use
    expect(memoryChart(points, 11, labels, 'peak').ranges!.mem[1]).toBeCloseTo(12 * GIB * 1.1);
  });

  it('keeps gaps as gaps in every layer', () => {
    const points = [pt(10, GIB, { k1: GIB }), { t: 11, gap: true, utilization: null, memoryUsed: null, memoryTotal: null }];
    const chart = memoryChart(points, 11, new Map());
    expect(chart.y.map(ys => ys[1])).toEqual([null, null]);
    expect(chart.series[0].label).toBe('kernel k1');
  });
});

describe('links and host charts', () => {
  it('draws PCIe and NVLink both ways, and the host CPU on 0–100 %', () => {
    const links = linksChart([{ t: 5, pcieTx: 1, pcieRx: 2, nvlinkTx: 3, nvlinkRx: null }], 5);
    expect(links.series.map(s => s.label)).toEqual(['PCIe out', 'PCIe in', 'NVLink out', 'NVLink in']);
    expect(links.y).toEqual([[1], [2], [3], [null]]);
    const host = hostChart([{ t: 1, cpu: 30, memoryUsed: GIB, memoryTotal: 4 * GIB }], 2);
    expect(host.ranges).toEqual({ pct: [0, 100], mem: [0, 4 * GIB] });
    expect(host.x).toEqual([-1]);
  });
});

describe('GpuDashboard', () => {
  function mounted(): { dashboard: GpuDashboard; history: DeviceHistory; opened: boolean[] } {
    const history = new DeviceHistory(120, 1);
    const dashboard = new GpuDashboard(history);
    const opened: boolean[] = [];
    dashboard.openChanged.connect((_, open) => opened.push(open));
    Widget.attach(dashboard, document.body);
    return { dashboard, history, opened };
  }

  it('is a closable main-area tab with a section per GPU and a host section', () => {
    const { dashboard, history, opened } = mounted();
    expect(opened).toEqual([true]);
    expect(dashboard.id).toBe('gpuctx-dashboard');
    expect(dashboard.title.closable).toBe(true);
    const snap = twoGpus(100);
    snap.host = { cpu_percent: 25, cpu_count: 16, memory_used: 8 * GIB, memory_total: 64 * GIB, time: 100, kernels: {} };
    history.addSnapshot(snap);
    dashboard.setSnapshot(snap);
    const sections = Array.from(dashboard.node.querySelectorAll('article.jp-gpuctx-dashboard-gpu')) as HTMLElement[];
    expect(sections.map(s => s.querySelector('h3')!.textContent)).toEqual(['cuda:0 · NVIDIA H200', 'cuda:1 · NVIDIA H200']);
    const titles = Array.from(sections[0].querySelectorAll('h4')).map(h => h.textContent);
    expect(titles).toEqual(['Utilisation', 'Memory by notebook', 'Temperature and power', 'PCIe and NVLink']);
    const plots = Array.from(sections[0].querySelectorAll('[role="img"]')).map(p => p.getAttribute('aria-label'));
    expect(plots[0]).toBe('Utilisation of cuda:0 over the last 10 min');
    expect(sections[0].querySelector('.jp-gpuctx-legend-kernel-0')!.textContent).toContain('train.ipynb');
    const host = dashboard.node.querySelector('.jp-gpuctx-dashboard-host') as HTMLElement;
    expect(host.hidden).toBe(false);
    expect(host.textContent).toContain('16 CPUs · CPU 25% · memory 8.00 GiB / 64.0 GiB');
    Widget.detach(dashboard);
    expect(opened).toEqual([true, false]);
  });

  it('closing it destroys its charts: none stays behind however often it is opened', async () => {
    const width = Object.getOwnPropertyDescriptor(HTMLElement.prototype, 'clientWidth');
    Object.defineProperty(HTMLElement.prototype, 'clientWidth', { configurable: true, get: () => 400 });
    try {
      for (let round = 0; round < 3; round++) {
        const { dashboard, history } = mounted();
        const snap = twoGpus(100);
        history.addSnapshot(snap);
        dashboard.setSnapshot(snap);
        await vi.waitFor(() => expect(livePlots.size).toBe(9)); // 4 per GPU and the host's, once uPlot has loaded
        dashboard.close();
        expect(dashboard.isDisposed).toBe(true);
        expect(livePlots.size).toBe(0);
      }
    } finally {
      if (width) {
        Object.defineProperty(HTMLElement.prototype, 'clientWidth', width);
      }
    }
  });

  it('switches the time range and the memory axis, and shows one GPU when picked', () => {
    const { dashboard, history } = mounted();
    const snap = twoGpus(100);
    history.addSnapshot(snap);
    dashboard.setSnapshot(snap);
    const pressed = () =>
      Array.from(dashboard.node.querySelectorAll('button[aria-pressed="true"]')).map(b => b.textContent);
    expect(pressed()).toEqual(['10 min', 'Memory in use']);
    (dashboard.node.querySelector('button[data-range="3600"]') as HTMLButtonElement).click();
    (dashboard.node.querySelector('button[data-scale="total"]') as HTMLButtonElement).click();
    expect(pressed()).toEqual(['1 h', 'GPU total']);
    expect(dashboard.range).toBe(3600);
    expect(dashboard.node.querySelector('[role="img"]')!.getAttribute('aria-label')).toContain('over the last 1 h');
    const select = dashboard.node.querySelector('select') as HTMLSelectElement;
    expect(Array.from(select.options).map(o => o.text)).toEqual(['All GPUs', 'cuda:0 · NVIDIA H200', 'cuda:1 · NVIDIA H200']);
    select.value = 'GPU-bbbb';
    select.dispatchEvent(new Event('change'));
    expect(dashboard.node.querySelectorAll('article.jp-gpuctx-dashboard-gpu')).toHaveLength(1);
    expect(dashboard.node.dataset.gpuctxShown).toBe('1');
    Widget.detach(dashboard);
  });

  it('says why there is no link throughput instead of drawing an empty chart', () => {
    const { dashboard, history } = mounted();
    const snap = { ...twoGpus(100), links_status: { interval: 5, reason: 'a replayed trace holds no PCIe or NVLink figures' } };
    history.addSnapshot(snap);
    dashboard.setSnapshot(snap);
    const links = dashboard.node.querySelectorAll('.jp-gpuctx-dashboard-chart')[3] as HTMLElement;
    const note = links.querySelector('.jp-gpuctx-dashboard-note') as HTMLElement;
    expect(note.hidden).toBe(false);
    expect(note.textContent).toBe('PCIe and NVLink throughput: a replayed trace holds no PCIe or NVLink figures.');
    expect((links.querySelector('.jp-gpuctx-chart') as HTMLElement).hidden).toBe(true);
    Widget.detach(dashboard);
  });
});
