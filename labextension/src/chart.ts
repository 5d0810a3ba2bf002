/**
 * Time-series charts (uPlot, drawn on a canvas): the panel's small chart of a GPU
 * (`HistoryChart`: utilisation solid on a 0–100 % axis, memory dashed on a 0–total axis) and the
 * dashboard's large ones (`TimeChart` with any series: per-notebook memory stacked, temperature
 * and power, link throughput). The time axis runs back from the newest sample ("−2 min" …
 * "now"); the legend under the plot shows the newest values, or the values under the pointer.
 *
 * Gaps are gaps: a point without values (history.ts's gap markers) breaks the lines, and a
 * pointer inside a gap reads "no sample" with the time under it, never the value of a sample
 * seconds away.
 *
 * Colours are the panel's CSS variables (`--gpuctx-util-color`, … pointing at the theme's `--jp-*`
 * colours), read each time the canvas is drawn, so a theme switch recolours the charts as it does
 * the bars and the legend swatches.
 *
 * uPlot (about 50 kB) is loaded the first time a chart is shown, not with the page: the status
 * bar, which every page has, does not need it.
 */
import type uPlot from 'uplot';

import { formatAgo, formatBytes, formatClock, formatPercent, formatSpan, MIB } from './format';
import { gapAfter, IHistoryPoint } from './history';
import { MemoryScale } from './settings';

/** The data of the panel's chart, oldest first: x in seconds before the newest sample (≤ 0). */
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

/** 0, half and all of an axis' range: three labels that never crowd a small chart. */
export function thirds(max: number): number[] {
  return [0, max / 2, max];
}

export const CHART_HEIGHT = 96;

let uPlotLoading: Promise<typeof uPlot> | null = null;

/** The uPlot class, loaded once for all charts. */
function loadUPlot(): Promise<typeof uPlot> {
  uPlotLoading ??= import('uplot').then(m => m.default);
  return uPlotLoading;
}

/** One line (or stacked band) of a chart. */
export interface ISeriesSpec {
  /** Names its legend item: `jp-gpuctx-legend-<key>`. */
  key: string;
  label: string;
  scale: string;
  /** The CSS custom property holding its colour, and the colour where there is none. */
  color: string;
  fallback: string;
  dash?: number[];
  /** Filled down to the series before it (to 0 for the first): a stacked area. */
  stacked?: boolean;
  /** The legend's text for a value. */
  format: (value: number | null) => string;
}

/** A y axis. */
export interface IAxisSpec {
  scale: string;
  side: 'left' | 'right';
  /** Room for its labels, px. */
  size: number;
  format: (value: number) => string;
  /** Where it is labelled, from its current range. */
  splits?: (max: number) => number[];
  /** The label at 0, where the unit would only crowd the axis ("0" rather than "0 MiB"). */
  zero?: string;
}

export interface ITimeChartSpec {
  series: ISeriesSpec[];
  axes: IAxisSpec[];
  height?: number;
}

/** What one update draws: x in seconds before `newest`, y per series, and what the legend says. */
export interface ITimeChartData {
  x: number[];
  /** What is drawn, per series (the stacked ones cumulated). */
  y: (number | null)[][];
  /** What the legend says, per series (each its own value); `y` when not given. */
  legend?: (number | null)[][];
  /** The top of each scale ([min, max] by scale name); a scale not named here runs 0..max of its data. */
  ranges?: Record<string, [number, number]>;
  newest: number | null;
  /** Points further apart than this have nothing between them, s (`gapAfter` the sampling interval). */
  gap?: number;
}

/**
 * A uPlot chart with a legend of its own (an HTML list under the canvas, so a screen reader and
 * a text search find its values), built once the plot area has a width.
 */
export class TimeChart {
  constructor(spec: ITimeChartSpec, className = 'jp-gpuctx-chart') {
    this._spec = spec;
    this.node = document.createElement('figure');
    this.node.className = className;
    this.node.dataset.gpuctxPoints = '0';
    this._plot = document.createElement('div');
    this._plot.className = 'jp-gpuctx-chart-plot';
    this._plot.setAttribute('role', 'img');
    this._plot.style.minHeight = `${spec.height ?? CHART_HEIGHT}px`;
    this._legend = document.createElement('figcaption');
    this._legend.className = 'jp-gpuctx-legend';
    this._time = document.createElement('span');
    this._time.className = 'jp-gpuctx-legend-time';
    this._setLegendItems(spec.series);
    this.node.append(this._plot, this._legend);
    if (typeof ResizeObserver !== 'undefined') {
      this._resize = new ResizeObserver(() => void this.fit());
      this._resize.observe(this.node);
    }
  }

  readonly node: HTMLElement;

  /** How many points the chart holds (a browser test can wait for it). */
  get points(): number {
    return this._data.x.length;
  }

  /** The series drawn now: the dashboard's memory chart has one per notebook. */
  get series(): readonly ISeriesSpec[] {
    return this._spec.series;
  }

  /**
   * New data; `series` when the set of series changed (a notebook started or stopped holding
   * memory): the chart is then rebuilt. Redraws, and refreshes the legend unless the pointer is
   * on the chart.
   */
  setData(data: ITimeChartData, spanSeconds: number, label: string, series?: ISeriesSpec[]): void {
    if (series && !sameSeries(series, this._spec.series)) {
      this._spec = { ...this._spec, series };
      this._setLegendItems(series);
      this._uplot?.destroy();
      this._uplot = null;
      this._plot.replaceChildren();
    }
    this._data = data;
    this._span = Math.max(1, spanSeconds);
    // What a browser test reads: how many points, how far back, and where nothing was sampled
    // (each gap as the times of the samples on either side, seconds since the epoch).
    this.node.dataset.gpuctxPoints = String(data.x.length);
    const at = (i: number) => (data.newest ?? 0) + data.x[i];
    const gaps = data.x.map((_, i) => i).filter(i => data.y.every(y => y[i] === null));
    this.node.dataset.gpuctxGaps = String(gaps.length);
    this.node.dataset.gpuctxGapSpans = JSON.stringify(
      gaps.filter(i => i > 0 && i < data.x.length - 1).map(i => [at(i - 1), at(i + 1)])
    );
    if (data.x.length) {
      this.node.dataset.gpuctxFrom = String(at(0));
      this.node.dataset.gpuctxNewest = String(data.newest);
    }
    this._plot.setAttribute('aria-label', label);
    if (this._uplot) {
      this._uplot.setData(this._aligned());
    } else {
      void this.fit();
    }
    this._showLegend(this._hover, this._hoverX);
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
    const height = this._spec.height ?? CHART_HEIGHT;
    if (this._uplot) {
      if (width !== this._uplot.width) {
        this._uplot.setSize({ width, height });
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
    return [this._data.x, ...this._data.y] as uPlot.AlignedData;
  }

  private _setLegendItems(series: ISeriesSpec[]): void {
    this._values = series.map(s => {
      const item = document.createElement('span');
      item.className = `jp-gpuctx-legend-item jp-gpuctx-legend-${s.key}`;
      const swatch = document.createElement('span');
      swatch.className = 'jp-gpuctx-legend-swatch';
      swatch.setAttribute('aria-hidden', 'true');
      swatch.style.setProperty('--gpuctx-swatch-color', `var(${s.color}, ${s.fallback})`);
      if (s.dash) {
        swatch.classList.add('jp-gpuctx-mod-dashed');
      }
      if (s.stacked) {
        swatch.classList.add('jp-gpuctx-mod-area');
      }
      const value = document.createElement('span');
      value.className = 'jp-gpuctx-legend-value';
      item.append(swatch, `${s.label} `, value);
      return { item, value };
    });
    this._legend.replaceChildren(...this._values.map(v => v.item), this._time);
  }

  /**
   * The legend at point `idx`, or at the newest point when the pointer is elsewhere. `atX`: the
   * time under the pointer (seconds before the newest), to say "no sample" inside a gap.
   */
  private _showLegend(idx: number | null, atX: number | null = null): void {
    this._hover = idx;
    this._hoverX = atX;
    const { x, y, newest } = this._data;
    const legend = this._data.legend ?? y;
    const n = x.length;
    const hovering = idx !== null && idx >= 0 && idx < n;
    const i = hovering ? idx! : n - 1;
    const span = `last ${formatSpan(this._span)}`;
    const setValues = (text: (s: number) => string) =>
      this._values.forEach((v, s) => {
        v.value.textContent = text(s);
      });
    if (i < 0) {
      setValues(() => '–');
      this._time.textContent = span;
      return;
    }
    const gap = this._data.gap ?? gapAfter(1);
    const isGap = legend.every(values => values[i] === null || values[i] === undefined);
    // Between two samples the line is drawn, however far apart they are (the server's rows older than
    // 10 min are 10 s apart): the nearest one's value. Towards a gap marker or past either end, only
    // within half a sampling interval of a sample.
    const toward = atX !== null && atX < x[i] ? i - 1 : i + 1;
    const drawn = toward >= 0 && toward < n && !legend.every(values => values[toward] === null || values[toward] === undefined);
    const far = hovering && atX !== null && !drawn && Math.abs(atX - x[i]) > gap / 2;
    if (hovering && (isGap || far)) {
      setValues(() => 'no sample');
      const at = atX ?? x[i];
      this._time.textContent = newest !== null ? formatClock((newest + at) * 1000) : '';
      return;
    }
    setValues(s => this._spec.series[s].format(legend[s]?.[i] ?? null));
    this._time.textContent = hovering && newest !== null ? formatClock((newest + x[i]) * 1000) : span;
  }

  private _options(width: number): uPlot.Options {
    const node = this.node;
    const family = cssColor(node, '--jp-ui-font-family', 'sans-serif');
    const font = `10px ${family}`;
    const axisColor = () => cssColor(node, '--jp-ui-font-color2', '#757575');
    const gridColor = () => cssColor(node, '--jp-border-color2', '#e0e0e0');
    const axis = { stroke: axisColor, font, ticks: { show: false }, gap: 2 };
    const series = this._spec.series;
    const scales: uPlot.Scales = { x: { time: false, range: () => [-this._span, 0] } };
    for (const a of this._spec.axes) {
      scales[a.scale] = { range: () => this._range(a.scale) };
    }
    const bands: uPlot.Band[] = [];
    series.forEach((s, i) => {
      if (s.stacked && i > 0 && series[i - 1].stacked) {
        bands.push({ series: [i + 1, i], fill: () => fade(cssColor(node, s.color, s.fallback)) });
      }
    });
    return {
      width,
      height: this._spec.height ?? CHART_HEIGHT,
      legend: { show: false },
      cursor: { y: false, drag: { x: false, y: false, setScale: false }, points: { size: 5 } },
      scales,
      bands,
      series: [
        {},
        ...series.map((s, i) => ({
          label: s.label,
          scale: s.scale,
          stroke: () => cssColor(node, s.color, s.fallback),
          width: s.stacked ? 1 : 1.5,
          ...(s.dash ? { dash: s.dash } : {}),
          ...(s.stacked && (i === 0 || !series[i - 1].stacked)
            ? { fill: () => fade(cssColor(node, s.color, s.fallback)) }
            : {}),
          points: { show: false }
        }))
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
        ...this._spec.axes.map((a, i) => ({
          ...axis,
          scale: a.scale,
          side: a.side === 'left' ? 3 : 1,
          size: a.size,
          grid: i === 0 ? { stroke: gridColor, width: 1 } : { show: false },
          splits: () => (a.splits ?? thirds)(this._range(a.scale)[1]),
          values: (_: uPlot, splits: number[]) => splits.map(v => (v === 0 && a.zero !== undefined ? a.zero : a.format(v)))
        }))
      ],
      hooks: {
        setCursor: [
          u => {
            const idx = typeof u.cursor.idx === 'number' ? u.cursor.idx : null;
            const left = u.cursor.left;
            const atX =
              idx !== null && typeof left === 'number' && left >= 0 && typeof u.posToVal === 'function'
                ? u.posToVal(left, 'x')
                : null;
            this._showLegend(idx, atX);
          }
        ]
      }
    };
  }

  /** A scale's range: as the data says, else 0 to the largest value drawn on it (at least 1). */
  private _range(scale: string): [number, number] {
    const given = this._data.ranges?.[scale];
    if (given) {
      return given;
    }
    let max = 0;
    this._spec.series.forEach((s, i) => {
      if (s.scale === scale) {
        for (const v of this._data.y[i] ?? []) {
          if (v !== null && v > max) {
            max = v;
          }
        }
      }
    });
    return [0, max > 0 ? max : 1];
  }

  private _spec: ITimeChartSpec;
  private _plot: HTMLElement;
  private _legend: HTMLElement;
  private _values: { item: HTMLElement; value: HTMLElement }[] = [];
  private _time: HTMLElement;
  private _uplot: uPlot | null = null;
  private _resize: ResizeObserver | null = null;
  private _data: ITimeChartData = { x: [], y: [], newest: null };
  private _span = 120;
  private _hover: number | null = null;
  private _hoverX: number | null = null;
  private _disposed = false;
}

function sameSeries(a: ISeriesSpec[], b: readonly ISeriesSpec[]): boolean {
  return a.length === b.length && a.every((s, i) => s.key === b[i].key && s.label === b[i].label && s.color === b[i].color);
}

/** A colour at 35 % opacity, for a stacked area under its line. */
function fade(color: string): string {
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec(color.trim());
  if (hex) {
    const h = hex[1].length === 3 ? hex[1].replace(/./g, c => c + c) : hex[1];
    const [r, g, b] = [0, 2, 4].map(i => parseInt(h.slice(i, i + 2), 16));
    return `rgba(${r}, ${g}, ${b}, 0.35)`;
  }
  const rgb = /^rgba?\(([^)]+)\)$/.exec(color.trim());
  if (rgb) {
    const [r, g, b] = rgb[1].split(/[\s,/]+/).filter(Boolean).map(Number);
    return `rgba(${r}, ${g}, ${b}, 0.35)`;
  }
  return color;
}

/** The panel's chart of one GPU: utilisation (solid, 0–100 %) and memory (dashed, 0–total). */
export const PANEL_CHART: ITimeChartSpec = {
  series: [
    {
      key: 'utilization',
      label: 'Utilisation',
      scale: 'pct',
      color: '--gpuctx-util-color',
      fallback: '#1976d2',
      format: formatPercent
    },
    {
      key: 'memory',
      label: 'Memory',
      scale: 'mem',
      color: '--gpuctx-memory-color',
      fallback: '#388e3c',
      dash: [4, 3],
      format: formatBytes
    }
  ],
  axes: [
    { scale: 'pct', side: 'left', size: 34, format: formatPercent, splits: () => [0, 50, 100] },
    { scale: 'mem', side: 'right', size: 50, format: formatBytes, zero: '0' }
  ]
};

/** The panel's small chart of a GPU's recent history. */
export class HistoryChart extends TimeChart {
  constructor() {
    super(PANEL_CHART);
  }

  /** New samples: redraw, and refresh the legend unless the pointer is on the chart. */
  update(points: IHistoryPoint[], spanSeconds: number, scale: MemoryScale, label: string, gap?: number): void {
    const d = chartData(points);
    this.node.dataset.gpuctxMemoryScale = scale;
    this.setData(
      {
        x: d.x,
        y: [d.utilization, d.memory],
        ranges: { pct: [0, 100], mem: [0, memoryAxisMax(points, scale) ?? MIB] },
        newest: d.newest,
        gap
      },
      spanSeconds,
      label
    );
  }
}
