/** A tiny SVG line chart of the last minutes: utilisation (solid) and memory (dashed). */
import { IHistoryPoint } from './history';

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * An SVG path through `values` (0..max) over a `width`×`height` box, newest at the right edge;
 * `span` is how many samples the full width holds. A gap (null) breaks the line.
 */
export function sparklinePath(
  values: (number | null)[],
  width: number,
  height: number,
  max = 100,
  span = values.length
): string {
  const slots = Math.max(2, span);
  const step = width / (slots - 1);
  const offset = slots - values.length; // fewer samples than slots: they fill from the right
  let d = '';
  let pen = false;
  values.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) {
      pen = false;
      return;
    }
    const x = (offset + i) * step;
    const y = height - (Math.min(max, Math.max(0, v)) / max) * height;
    d += `${pen ? 'L' : 'M'}${x.toFixed(1)} ${y.toFixed(1)}`;
    pen = true;
  });
  return d;
}

export function createSparkline(width: number, height: number): SVGSVGElement {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'jp-gpuctx-sparkline');
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('role', 'img');
  for (const kind of ['grid', 'memory', 'utilization']) {
    const path = document.createElementNS(SVG_NS, 'path');
    path.setAttribute('class', `jp-gpuctx-sparkline-${kind}`);
    path.setAttribute('vector-effect', 'non-scaling-stroke');
    if (kind === 'grid') {
      path.setAttribute('d', `M0 ${height / 2}L${width} ${height / 2}`);
    }
    svg.appendChild(path);
  }
  return svg;
}

export function updateSparkline(
  svg: SVGSVGElement,
  points: IHistoryPoint[],
  span: number,
  label: string
): void {
  const [width, height] = (svg.getAttribute('viewBox') ?? '0 0 100 24').split(' ').slice(2).map(Number);
  const util = points.map(p => p.utilization);
  const mem = points.map(p => (p.memory === null ? null : p.memory * 100));
  svg.querySelector('.jp-gpuctx-sparkline-utilization')?.setAttribute('d', sparklinePath(util, width, height, 100, span));
  svg.querySelector('.jp-gpuctx-sparkline-memory')?.setAttribute('d', sparklinePath(mem, width, height, 100, span));
  svg.setAttribute('aria-label', label);
}
