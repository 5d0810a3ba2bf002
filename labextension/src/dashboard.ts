/**
 * The GPU dashboard: a main-area widget (dockable like any JupyterLab tab, restored with the
 * layout) with large charts per GPU over 2 min, 10 min or 1 h — utilisation; memory, stacked by
 * the notebook holding it; temperature and power; PCIe and NVLink throughput where NVML reports
 * them — and the host's CPU and memory.
 *
 * It draws the page's one history (history.ts): the server's last hour arrives when it opens
 * (the stream asks for it, and for link throughput, while a dashboard is open), then every
 * snapshot. Nothing here asks the server anything itself.
 */
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { ISeriesSpec, thirds, TimeChart } from './chart';
import { IHealth } from './controller';
import { formatBytes, formatPercent, formatPower, formatRate, formatSpan, formatTemperature, MIB } from './format';
import { DeviceHistory, gapAfter, IHistoryPoint, IHostPoint, ILinkPoint } from './history';
import { describeDevice, IDeviceView } from './model';
import { createStateLine, el, syncKeyed, updateStateLine } from './panel';
import { MemoryScale } from './settings';
import { deviceKey, ISnapshot } from './types';

export const DASHBOARD_ID = 'gpuctx-dashboard';

/** The time ranges a person picks from, seconds. */
export const RANGES = [120, 600, 3600] as const;
export const DEFAULT_RANGE = 600;

/** Colours for the notebooks stacked in the memory chart: the theme's, distinct in light and dark. */
const KERNEL_COLORS: [string, string][] = [
  ['--jp-brand-color1', '#1976d2'],
  ['--jp-warn-color1', '#f57c00'],
  ['--jp-accent-color1', '#388e3c'],
  ['--jp-error-color1', '#d32f2f'],
  ['--jp-brand-color3', '#bbdefb'],
  ['--jp-warn-color2', '#ffb74d'],
  ['--jp-accent-color3', '#c8e6c9'],
  ['--jp-error-color3', '#ffcdd2']
];
const OTHER_COLOR: [string, string] = ['--jp-layout-color4', '#757575'];

/** What one chart draws: x (seconds before `newest`), a y list per series, the legend's own values. */
export interface IChartInput {
  x: number[];
  y: (number | null)[][];
  legend?: (number | null)[][];
  series: ISeriesSpec[];
  ranges?: Record<string, [number, number]>;
}

function relative(points: { t: number }[], newest: number): number[] {
  return points.map(p => p.t - newest);
}

export function utilizationChart(points: IHistoryPoint[], newest: number): IChartInput {
  return {
    x: relative(points, newest),
    y: [points.map(p => p.utilization)],
    series: [
      { key: 'utilization', label: 'Utilisation', scale: 'pct', color: '--gpuctx-util-color', fallback: '#1976d2', format: formatPercent }
    ],
    ranges: { pct: [0, 100] }
  };
}

/**
 * Memory used, stacked by who holds it: each notebook's kernel (largest first, by its most in
 * the window) and then "other processes" (what NVML lists for processes that are not this
 * server's kernels, and what it does not attribute), up to the GPU's memory in use.
 */
export function memoryChart(
  points: IHistoryPoint[],
  newest: number,
  labels: ReadonlyMap<string, string>,
  scale: MemoryScale = 'total'
): IChartInput {
  const most = new Map<string, number>();
  for (const p of points) {
    for (const [kernel, used] of Object.entries(p.kernels ?? {})) {
      most.set(kernel, Math.max(most.get(kernel) ?? 0, used));
    }
  }
  const kernels = Array.from(most.keys()).sort((a, b) => most.get(b)! - most.get(a)!);
  const own = kernels.map(k => points.map(p => (p.gap || p.memoryUsed === null ? null : p.kernels?.[k] ?? 0)));
  const other = points.map((p, i) =>
    p.memoryUsed === null ? null : Math.max(0, p.memoryUsed - own.reduce((sum, ys) => sum + (ys[i] ?? 0), 0))
  );
  const layers = [...own, other];
  const stacked: (number | null)[][] = [];
  layers.forEach((ys, n) =>
    stacked.push(ys.map((v, i) => (v === null ? null : v + (n > 0 ? stacked[n - 1][i] ?? 0 : 0))))
  );
  const total = [...points].reverse().find(p => p.memoryTotal !== null)?.memoryTotal ?? null;
  const series: ISeriesSpec[] = [
    ...kernels.map((k, n) => {
      const [color, fallback] = KERNEL_COLORS[n % KERNEL_COLORS.length];
      return { key: `kernel-${n}`, label: labels.get(k) ?? `kernel ${k.slice(0, 8)}`, scale: 'mem', color, fallback, stacked: true, format: formatBytes };
    }),
    { key: 'other', label: 'Other processes', scale: 'mem', color: OTHER_COLOR[0], fallback: OTHER_COLOR[1], stacked: true, format: formatBytes }
  ];
  const peak = Math.max(MIB, ...points.map(p => p.memoryUsed ?? 0));
  const top = scale === 'peak' || total === null ? peak * 1.1 : total;
  return { x: relative(points, newest), y: stacked, legend: layers, series, ranges: { mem: [0, top] } };
}

export function thermalChart(points: IHistoryPoint[], newest: number, powerLimit: number | null): IChartInput {
  const hottest = Math.max(0, ...points.map(p => p.temperature ?? 0));
  const most = Math.max(0, ...points.map(p => p.power ?? 0));
  return {
    x: relative(points, newest),
    y: [points.map(p => p.temperature ?? null), points.map(p => p.power ?? null)],
    series: [
      { key: 'temperature', label: 'Temperature', scale: 'temp', color: '--jp-warn-color1', fallback: '#f57c00', format: formatTemperature },
      { key: 'power', label: 'Power', scale: 'power', color: '--jp-brand-color1', fallback: '#1976d2', dash: [4, 3], format: watts }
    ],
    ranges: { temp: [0, Math.max(100, hottest)], power: [0, Math.max(powerLimit ?? 0, most, 1)] }
  };
}

export function linksChart(points: ILinkPoint[], newest: number): IChartInput {
  return {
    x: relative(points, newest),
    y: [points.map(p => p.pcieTx), points.map(p => p.pcieRx), points.map(p => p.nvlinkTx), points.map(p => p.nvlinkRx)],
    series: [
      { key: 'pcie-tx', label: 'PCIe out', scale: 'rate', color: '--jp-brand-color1', fallback: '#1976d2', format: formatRate },
      { key: 'pcie-rx', label: 'PCIe in', scale: 'rate', color: '--jp-brand-color1', fallback: '#1976d2', dash: [4, 3], format: formatRate },
      { key: 'nvlink-tx', label: 'NVLink out', scale: 'rate', color: '--jp-accent-color1', fallback: '#388e3c', format: formatRate },
      { key: 'nvlink-rx', label: 'NVLink in', scale: 'rate', color: '--jp-accent-color1', fallback: '#388e3c', dash: [4, 3], format: formatRate }
    ]
  };
}

export function hostChart(points: IHostPoint[], newest: number): IChartInput {
  const total = [...points].reverse().find(p => p.memoryTotal !== null)?.memoryTotal ?? null;
  return {
    x: relative(points, newest),
    y: [points.map(p => p.cpu), points.map(p => p.memoryUsed)],
    series: [
      { key: 'cpu', label: 'CPU', scale: 'pct', color: '--gpuctx-util-color', fallback: '#1976d2', format: formatPercent },
      { key: 'host-memory', label: 'Memory', scale: 'mem', color: '--gpuctx-memory-color', fallback: '#388e3c', dash: [4, 3], format: formatBytes }
    ],
    ranges: { pct: [0, 100], mem: [0, total ?? Math.max(MIB, ...points.map(p => p.memoryUsed ?? 0))] }
  };
}

/** "534 W". */
function watts(v: number | null): string {
  return formatPower(v, null);
}

let uid = 0;

/** A titled chart: its heading, then the chart (or a line saying why there is none). */
interface IPanelChart {
  root: HTMLElement;
  chart: TimeChart;
  note: HTMLElement;
}

function titledChart(title: string, chart: TimeChart): IPanelChart {
  const root = el('section', 'jp-gpuctx-dashboard-chart');
  const heading = el('h4', 'jp-gpuctx-dashboard-chart-title', title);
  heading.id = `jp-gpuctx-dash-${++uid}`;
  root.setAttribute('aria-labelledby', heading.id);
  const note = el('p', 'jp-gpuctx-dashboard-note');
  note.hidden = true;
  root.append(heading, chart.node, note);
  return { root, chart, note };
}

interface IGpuSection {
  root: HTMLElement;
  title: HTMLElement;
  facts: HTMLElement;
  util: IPanelChart;
  memory: IPanelChart;
  thermal: IPanelChart;
  links: IPanelChart;
}

const axes = {
  pct: { scale: 'pct', side: 'left' as const, size: 40, format: formatPercent, splits: () => [0, 25, 50, 75, 100] },
  mem: (side: 'left' | 'right') => ({ scale: 'mem', side, size: 60, format: formatBytes, splits: thirds, zero: '0' })
};

export class GpuDashboard extends Widget {
  constructor(private _history: DeviceHistory) {
    super();
    this.id = DASHBOARD_ID;
    this.addClass('jp-gpuctx-dashboard');
    this.title.label = 'GPU dashboard';
    this.title.caption = 'GPU dashboard: utilisation, memory by notebook, temperature, power, links, host';
    this.title.closable = true;
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU dashboard');
    this.node.tabIndex = -1;

    const header = el('div', 'jp-gpuctx-dashboard-header');
    header.appendChild(el('h2', 'jp-gpuctx-heading', 'GPU dashboard'));
    const controls = el('div', 'jp-gpuctx-dashboard-controls');
    const ranges = el('div', 'jp-gpuctx-range');
    ranges.setAttribute('role', 'group');
    ranges.setAttribute('aria-label', 'Time range');
    for (const seconds of RANGES) {
      const button = el('button', 'jp-gpuctx-button jp-gpuctx-range-button', formatSpan(seconds));
      button.type = 'button';
      button.dataset.range = String(seconds);
      button.title = `Show the last ${formatSpan(seconds)}`;
      button.addEventListener('click', () => this.setRange(seconds));
      ranges.appendChild(button);
      this._rangeButtons.push(button);
    }
    // A few GiB on a 140 GiB axis is a line at 0: the axis follows the memory in use unless asked.
    const scales = el('div', 'jp-gpuctx-range');
    scales.setAttribute('role', 'group');
    scales.setAttribute('aria-label', 'Memory axis');
    for (const [scale, text, title] of [
      ['peak', 'Memory in use', 'Memory axis up to the most used in the range'],
      ['total', 'GPU total', "Memory axis up to the GPU's total memory"]
    ] as [MemoryScale, string, string][]) {
      const button = el('button', 'jp-gpuctx-button jp-gpuctx-range-button', text);
      button.type = 'button';
      button.dataset.scale = scale;
      button.title = title;
      button.addEventListener('click', () => this.setMemoryScale(scale));
      scales.appendChild(button);
      this._scaleButtons.push(button);
    }
    const pick = el('label', 'jp-gpuctx-dashboard-pick');
    pick.append('GPUs ');
    this._select = el('select', 'jp-gpuctx-dashboard-select');
    this._select.addEventListener('change', () => this._draw());
    pick.appendChild(this._select);
    controls.append(ranges, scales, pick);
    header.appendChild(controls);
    this._state = createStateLine();
    header.appendChild(this._state.root);
    this.node.appendChild(header);

    this._noGpu = el('p', 'jp-gpuctx-nogpu');
    this._noGpu.setAttribute('role', 'status');
    this._noGpu.textContent = 'Waiting for the gpuctx server…';
    this.node.appendChild(this._noGpu);
    this._gpus = el('div', 'jp-gpuctx-dashboard-gpus');
    this.node.appendChild(this._gpus);

    this._host = el('section', 'jp-gpuctx-dashboard-gpu jp-gpuctx-dashboard-host');
    const hostTitle = el('h3', 'jp-gpuctx-card-title', 'Host');
    hostTitle.id = `jp-gpuctx-dash-${++uid}`;
    this._host.setAttribute('aria-labelledby', hostTitle.id);
    this._hostFacts = el('div', 'jp-gpuctx-card-subtitle');
    this._hostChart = titledChart(
      'CPU and memory',
      new TimeChart({ series: hostChart([], 0).series, axes: [axes.pct, axes.mem('right')], height: 160 })
    );
    this._host.append(hostTitle, this._hostFacts, this._hostChart.root);
    this.node.appendChild(this._host);
    this.setMemoryScale('peak');
    this.setRange(DEFAULT_RANGE);
  }

  /** Emits true when the dashboard is attached to the page, false when it is detached. */
  get openChanged(): ISignal<this, boolean> {
    return this._openChanged;
  }

  get range(): number {
    return this._range;
  }

  setRange(seconds: number): void {
    this._range = seconds;
    for (const button of this._rangeButtons) {
      button.setAttribute('aria-pressed', String(Number(button.dataset.range) === seconds));
    }
    this._draw();
  }

  /** The memory charts' axis: up to the most used in the range, or to the GPU's total. */
  setMemoryScale(scale: MemoryScale): void {
    this._memoryScale = scale;
    for (const button of this._scaleButtons) {
      button.setAttribute('aria-pressed', String(button.dataset.scale === scale));
    }
    this._draw();
  }

  setSnapshot(snapshot: ISnapshot): void {
    this._snapshot = snapshot;
    this._draw();
  }

  setHealth(health: IHealth): void {
    updateStateLine(this._state, health.state, this._snapshot?.replay?.source ?? null);
    this.toggleClass('jp-gpuctx-stale', health.state.down && health.lastUpdate !== null);
  }

  /** Redraw the charts with the theme's colours (after a theme change). */
  redrawCharts(): void {
    for (const chart of this._charts()) {
      chart.redraw();
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._openChanged.emit(true);
  }

  protected onBeforeDetach(msg: Message): void {
    this._openChanged.emit(false);
    super.onBeforeDetach(msg);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._draw();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    for (const chart of this._charts()) {
      void chart.fit();
    }
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    this.node.focus();
  }

  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    for (const chart of this._charts()) {
      chart.dispose(); // (uPlot keeps every plot not destroyed, with its data, for the page's life)
    }
    this._sections.clear();
    super.dispose();
  }

  private *_charts(): Generator<TimeChart> {
    for (const s of this._sections.values()) {
      yield s.util.chart;
      yield s.memory.chart;
      yield s.thermal.chart;
      yield s.links.chart;
    }
    yield this._hostChart.chart;
  }

  private _draw(): void {
    const snapshot = this._snapshot;
    if (!snapshot || !this.isVisible) {
      return;
    }
    const devices = (snapshot.devices ?? []).map(d => describeDevice(d));
    const noGpu = !snapshot.gpu || devices.length === 0 ? snapshot.reason || 'The server sees no GPU.' : null;
    this._noGpu.hidden = noGpu === null;
    if (noGpu !== null) {
      this._noGpu.replaceChildren(el('strong', undefined, 'No GPU'), `: ${noGpu}`);
    }
    this._renderSelect(devices);
    const chosen = this._select.value;
    const shown = chosen === 'all' ? devices : devices.filter(d => d.key === chosen);
    this.node.dataset.gpuctxShown = String(shown.length);
    syncKeyed(this._gpus, this._sections, shown, key => this._createSection(key), (s, d) => this._updateSection(s, d, snapshot),
      s => {
        s.util.chart.dispose();
        s.memory.chart.dispose();
        s.thermal.chart.dispose();
        s.links.chart.dispose();
        s.root.remove();
      });
    this._drawHost(snapshot);
  }

  private _renderSelect(devices: IDeviceView[]): void {
    const key = devices.map(d => `${d.key}=${d.title}`).join('|');
    if (key === this._selectKey) {
      return;
    }
    this._selectKey = key;
    const before = this._select.value || 'all';
    const options = [new Option('All GPUs', 'all'), ...devices.map(d => new Option(d.title, d.key))];
    this._select.replaceChildren(...options);
    this._select.value = options.some(o => o.value === before) ? before : 'all';
  }

  private _createSection(key: string): IGpuSection {
    const root = el('article', 'jp-gpuctx-dashboard-gpu');
    root.dataset.gpuctxDevice = key;
    const title = el('h3', 'jp-gpuctx-card-title');
    title.id = `jp-gpuctx-dash-${++uid}`;
    root.setAttribute('aria-labelledby', title.id);
    const facts = el('div', 'jp-gpuctx-card-subtitle');
    const grid = el('div', 'jp-gpuctx-dashboard-grid');
    const height = 160;
    const util = titledChart('Utilisation', new TimeChart({ series: utilizationChart([], 0).series, axes: [axes.pct], height }));
    const memory = titledChart(
      'Memory by notebook',
      new TimeChart({ series: memoryChart([], 0, new Map()).series, axes: [axes.mem('left')], height })
    );
    const thermal = titledChart(
      'Temperature and power',
      new TimeChart({
        series: thermalChart([], 0, null).series,
        axes: [
          { scale: 'temp', side: 'left', size: 44, format: formatTemperature },
          { scale: 'power', side: 'right', size: 44, format: watts }
        ],
        height
      })
    );
    const links = titledChart(
      'PCIe and NVLink',
      new TimeChart({
        series: linksChart([], 0).series,
        axes: [{ scale: 'rate', side: 'left', size: 70, format: formatRate, zero: '0' }],
        height
      })
    );
    grid.append(util.root, memory.root, thermal.root, links.root);
    root.append(title, facts, grid);
    return { root, title, facts, util, memory, thermal, links };
  }

  private _updateSection(s: IGpuSection, d: IDeviceView, snapshot: ISnapshot): void {
    if (s.title.textContent !== d.title) {
      s.title.textContent = d.title;
    }
    s.title.title = d.tooltip;
    const facts = [d.subtitle, `utilisation ${d.utilizationText}`, `memory ${d.memoryText}`, d.temperatureText, d.powerText]
      .filter(Boolean)
      .join(' · ');
    if (s.facts.textContent !== facts) {
      s.facts.textContent = facts;
    }
    const newest = snapshot.time;
    const span = this._range;
    const gap = gapAfter(1);
    const points = this._history.points(d.key, span);
    const device = snapshot.devices.find(x => deviceKey(x) === d.key);
    const name = `${d.shortName} over the last ${formatSpan(span)}`;
    this._setChart(s.util.chart, utilizationChart(points, newest), span, `Utilisation of ${name}`, gap);
    this._setChart(s.memory.chart, memoryChart(points, newest, this._history.labels, this._memoryScale), span,
      `Memory of ${name}, stacked by the notebook holding it`, gap);
    this._setChart(s.thermal.chart, thermalChart(points, newest, device?.power_limit_w ?? null), span,
      `Temperature and power of ${name}`, gap);
    const links = this._history.linkPoints(d.key, span);
    const status = snapshot.links_status;
    const reason = status?.reason ?? null;
    const reading = !links.length && !reason ? 'waiting for the first reading (every 5 s)' : null;
    const why = reason ?? reading;
    s.links.note.hidden = why === null;
    const text = why ? `PCIe and NVLink throughput: ${why}.` : '';
    if (s.links.note.textContent !== text) {
      s.links.note.textContent = text;
    }
    s.links.chart.node.hidden = !links.length;
    this._setChart(s.links.chart, linksChart(links, newest), span, `PCIe and NVLink throughput of ${name}`, gapAfter(5));
  }

  private _drawHost(snapshot: ISnapshot): void {
    const host = snapshot.host;
    const points = this._history.hostPoints(this._range);
    this._host.hidden = !host && !points.length;
    const facts = host?.reason
      ? host.reason
      : host
        ? [
            host.cpu_count ? `${host.cpu_count} CPUs` : null,
            `CPU ${formatPercent(host.cpu_percent)}`,
            `memory ${formatBytes(host.memory_used)} / ${formatBytes(host.memory_total)}`
          ]
            .filter(Boolean)
            .join(' · ')
        : '';
    if (this._hostFacts.textContent !== facts) {
      this._hostFacts.textContent = facts;
    }
    this._setChart(this._hostChart.chart, hostChart(points, snapshot.time), this._range,
      `Host CPU and memory over the last ${formatSpan(this._range)}`, gapAfter(2));
  }

  private _setChart(chart: TimeChart, input: IChartInput, span: number, label: string, gap: number): void {
    chart.setData(
      { x: input.x, y: input.y, legend: input.legend, ranges: input.ranges, newest: this._snapshot?.time ?? null, gap },
      span,
      label,
      input.series
    );
  }

  private _range = DEFAULT_RANGE;
  private _rangeButtons: HTMLButtonElement[] = [];
  private _scaleButtons: HTMLButtonElement[] = [];
  private _memoryScale: MemoryScale = 'peak';
  private _select: HTMLSelectElement;
  private _selectKey = '';
  private _state: ReturnType<typeof createStateLine>;
  private _noGpu: HTMLElement;
  private _gpus: HTMLElement;
  private _sections = new Map<string, IGpuSection>();
  private _host: HTMLElement;
  private _hostFacts: HTMLElement;
  private _hostChart: IPanelChart;
  private _snapshot: ISnapshot | null = null;
  private _openChanged = new Signal<this, boolean>(this);
}

