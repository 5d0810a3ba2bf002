/**
 * A GPU's recent history as a small time-series chart (uPlot, drawn on a canvas): utilisation
 * (solid, left axis 0–100 %) and memory used (dashed, right axis 0 to the GPU's total, or to the
 * peak seen when the setting asks for it), the time axis relative to the newest sample
 * ("−2 min" … "now"), values under the pointer in a legend below.
 *
 * Colours are the panel's CSS variables (`--gpuctx-util-color`, `--gpuctx-memory-color`, which
 * point at the theme's `--jp-*` colours), read each time the canvas is drawn, so a theme switch
 * recolours the chart as it does the bars and the legend swatches.
 *
 * uPlot (about 50 kB) is loaded the first time a chart is shown, not with the page: the status
 * bar, which every page has, does not need it.
 */
import type uPlot from 'uplot';

import { formatAgo, formatBytes, formatClock, formatPercent, formatSpan, MIB } from './format';
import { IHistoryPoint } from './history';
import { MemoryScale } from './settings';

/** The data of one chart, oldest first: x in seconds before the newest sample (≤ 0). */
export interface IChartData {
  x: number[];
  utilization: (number | null)[];
  memory: (number | null)[];
  /** The newest sample's time, seconds since the epoch; null without samples. */
  newest: number | null;
}

export function chartData(points: IHistoryPoint[]): IChartData {
  const newest = points.length ? points[points.length - 1].t : null;
  return {
    x: points.map(p => p.t - (newest ?? 0)),
    utilization: points.map(p => p.utilization),
    memory: points.map(p => p.memoryUsed),
    newest
  };
}

/**
 * The top of the memory axis, bytes: the GPU's total, or with `peak` the most used in the
 * window (at least 1 MiB, so an idle GPU still has an axis). Null when nothing is known.
 */
export function memoryAxisMax(points: IHistoryPoint[], scale: MemoryScale): number | null {
  const used = points.map(p => p.memoryUsed).filter((v): v is number => v !== null);
  if (scale === 'total') {
    for (let i = points.length - 1; i >= 0; i--) {
      const total = points[i].memoryTotal;
      if (total !== null && total > 0) {
        return total;
      }
    }
  }
  return used.length ? Math.max(MIB, ...used) : null;
}

const TIME_STEPS = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

/**
 * Where the time axis is labelled, seconds before now (≤ 0): the smallest round step that
 * leaves each label about 56 px, counted back from "now".
 */
export function timeSplits(spanSeconds: number, plotWidth: number): number[] {
  const room = Math.max(1, Math.floor(plotWidth / 56));
  const step = TIME_STEPS.find(s => spanSeconds / s <= room) ?? Math.ceil(spanSeconds / room);
  const splits: number[] = [];
  for (let v = 0; v >= -spanSeconds - 1e-9; v -= step) {
    splits.unshift(v === 0 ? 0 : v);
  }
  return splits;
}

/** A CSS colour variable as the node sees it now (the theme may have changed since). */
export function cssColor(node: Element, name: string, fallback: string): string {
  if (typeof getComputedStyle !== 'function') {
    return fallback;
  }
  return getComputedStyle(node).getPropertyValue(name).trim() || fallback;
}

export const CHART_HEIGHT = 96;

let uPlotLoading: Promise<typeof uPlot> | null = null;

/** The uPlot class, loaded once for all charts. */
function loadUPlot(): Promise<typeof uPlot> {
  uPlotLoading ??= import('uplot').then(m => m.default);
  return uPlotLoading;
}

export class HistoryChart {
  constructor() {
    this.node = document.createElement('figure');
    this.node.className = 'jp-gpuctx-chart';
    this.node.dataset.gpuctxPoints = '0';
    this._plot = document.createElement('div');
    this._plot.className = 'jp-gpuctx-chart-plot';
    this._plot.setAttribute('role', 'img');
    const legend = document.createElement('figcaption');
    legend.className = 'jp-gpuctx-legend';
    const item = (kind: string, name: string) => {
      const span = document.createElement('span');
      span.className = `jp-gpuctx-legend-item jp-gpuctx-legend-${kind}`;
      const swatch = document.createElement('span');
      swatch.className = 'jp-gpuctx-legend-swatch';
      swatch.setAttribute('aria-hidden', 'true');
      const value = document.createElement('span');
      value.className = 'jp-gpuctx-legend-value';
      span.append(swatch, `${name} `, value);
      legend.appendChild(span);
      return value;
    };
    this._utilValue = item('utilization', 'Utilisation');
    this._memValue = item('memory', 'Memory');
    this._time = document.createElement('span');
    this._time.className = 'jp-gpuctx-legend-time';
    legend.appendChild(this._time);
    this.node.append(this._plot, legend);
    if (typeof ResizeObserver !== 'undefined') {
      this._resize = new ResizeObserver(() => void this.fit());
      this._resize.observe(this.node);
    }
  }

  readonly node: HTMLElement;

  /** How many samples the chart holds (a browser test can wait for it). */
  get points(): number {
    return this._data.x.length;
  }

  /** New samples: redraw, and refresh the legend unless the pointer is on the chart. */
  update(points: IHistoryPoint[], spanSeconds: number, scale: MemoryScale, label: string): void {
    this._data = chartData(points);
    this._span = Math.max(1, spanSeconds);
    this._memMax = memoryAxisMax(points, scale);
    this.node.dataset.gpuctxPoints = String(points.length);
    this.node.dataset.gpuctxMemoryScale = scale;
    this._plot.setAttribute('aria-label', label);
    if (this._uplot) {
      this._uplot.setData(this._aligned());
    } else {
      void this.fit();
    }
    this._showLegend(this._hover);
  }

  /**
   * Match the node's width; build the chart the first time it has one (a hidden panel has none).
   * Resolves once the chart is drawn, or there is nothing to draw on.
   */
  async fit(): Promise<void> {
    const width = Math.floor(this._plot.clientWidth);
    if (width <= 0 || this._disposed) {
      return;
    }
    if (this._uplot) {
      if (width !== this._uplot.width) {
        this._uplot.setSize({ width, height: CHART_HEIGHT });
      }
      return;
    }
    const UPlot = await loadUPlot();
    if (this._uplot || this._disposed) {
      return this.fit(); // another call built it meanwhile
    }
    this._uplot = new UPlot(this._options(Math.floor(this._plot.clientWidth) || width), this._aligned(), this._plot);
  }

  /** Draw again with the colours the theme has now. */
  redraw(): void {
    this._uplot?.redraw(false, true);
  }

  dispose(): void {
    this._disposed = true;
    this._resize?.disconnect();
    this._uplot?.destroy();
    this._uplot = null;
    this.node.remove();
  }

  private _aligned(): uPlot.AlignedData {
    return [this._data.x, this._data.utilization, this._data.memory] as uPlot.AlignedData;
  }

  /** The legend at sample `idx`, or at the newest sample when the pointer is elsewhere. */
  private _showLegend(idx: number | null): void {
    this._hover = idx;
    const n = this._data.x.length;
    const i = idx !== null && idx >= 0 && idx < n ? idx : n - 1;
    if (i < 0) {
      this._utilValue.textContent = '–';
      this._memValue.textContent = '–';
      this._time.textContent = `last ${formatSpan(this._span)}`;
      return;
    }
    this._utilValue.textContent = formatPercent(this._data.utilization[i]);
    this._memValue.textContent = formatBytes(this._data.memory[i]);
    const hovering = idx !== null && idx >= 0 && idx < n;
    this._time.textContent =
      hovering && this._data.newest !== null
        ? formatClock((this._data.newest + this._data.x[i]) * 1000)
        : `last ${formatSpan(this._span)}`;
  }

  private _options(width: number): uPlot.Options {
    const node = this.node;
    const family = cssColor(node, '--jp-ui-font-family', 'sans-serif');
    const font = `10px ${family}`;
    const axisColor = () => cssColor(node, '--jp-ui-font-color2', '#757575');
    const gridColor = () => cssColor(node, '--jp-border-color2', '#e0e0e0');
    const util = () => cssColor(node, '--gpuctx-util-color', '#1976d2');
    const mem = () => cssColor(node, '--gpuctx-memory-color', '#388e3c');
    const axis = { stroke: axisColor, font, ticks: { show: false }, gap: 2 };
    return {
      width,
      height: CHART_HEIGHT,
      legend: { show: false },
      cursor: { y: false, drag: { x: false, y: false, setScale: false }, points: { size: 5 } },
      scales: {
        x: { time: false, range: () => [-this._span, 0] },
        pct: { range: [0, 100] },
        mem: { range: () => [0, this._memMax ?? MIB] }
      },
      series: [
        {},
        { label: 'Utilisation', scale: 'pct', stroke: util, width: 1.5, points: { show: false } },
        { label: 'Memory', scale: 'mem', stroke: mem, width: 1.5, dash: [4, 3], points: { show: false } }
      ],
      axes: [
        {
          ...axis,
          scale: 'x',
          size: 24,
          gap: 7, // below the y axes' bottom labels, which are centred on the baseline
          grid: { stroke: gridColor, width: 1 },
          splits: u => timeSplits(this._span, u.bbox.width / (devicePixelRatio || 1)),
          values: (_, splits) => splits.map(formatAgo)
        },
        {
          ...axis,
          scale: 'pct',
          side: 3,
          size: 34,
          grid: { stroke: gridColor, width: 1 },
          splits: () => [0, 50, 100],
          values: (_, splits) => splits.map(formatPercent)
        },
        {
          ...axis,
          scale: 'mem',
          side: 1,
          size: 50,
          grid: { show: false },
          splits: () => {
            const max = this._memMax ?? MIB;
            return [0, max / 2, max];
          },
          values: (_, splits) => splits.map(v => (v === 0 ? '0' : formatBytes(v)))
        }
      ],
      hooks: {
        setCursor: [u => this._showLegend(typeof u.cursor.idx === 'number' ? u.cursor.idx : null)]
      }
    };
  }

  private _plot: HTMLElement;
  private _utilValue: HTMLElement;
  private _memValue: HTMLElement;
  private _time: HTMLElement;
  private _uplot: uPlot | null = null;
  private _resize: ResizeObserver | null = null;
  private _data: IChartData = { x: [], utilization: [], memory: [], newest: null };
  private _span = 120;
  private _memMax: number | null = null;
  private _hover: number | null = null;
  private _disposed = false;
}
