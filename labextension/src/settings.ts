/**
 * The user's settings (schema/plugin.json), read into one typed object. A value that is missing
 * or of the wrong kind falls back to its default, so a hand-edited settings file cannot break
 * the panel.
 */

export type MemoryScale = 'total' | 'peak';

export interface IGpuSettings {
  /** Seconds between samples on the stream. */
  refreshRate: number;
  /** Seconds the charts reach back. */
  historyLength: number;
  showStatusBar: boolean;
  /** Memory use (percent of the GPU's total) above which the status bar and meters warn. */
  memoryWarningPercent: number;
  /** The charts' memory axis: up to the GPU's total, or up to the peak seen in the window. */
  chartMemoryScale: MemoryScale;
  /** With more GPUs than this, the panel shows one compact row per GPU instead of cards. */
  compactAbove: number;
  /** Send the notebooks' code cells, as typed, to their kernels' warm plans (cells.ts). */
  warmTypedCells: boolean;
}

export const DEFAULT_SETTINGS: IGpuSettings = {
  refreshRate: 1,
  historyLength: 120,
  showStatusBar: true,
  memoryWarningPercent: 90,
  chartMemoryScale: 'total',
  compactAbove: 4,
  warmTypedCells: true
};

function num(value: unknown, fallback: number, min: number, max: number): number {
  return typeof value === 'number' && Number.isFinite(value) ? Math.min(max, Math.max(min, value)) : fallback;
}

/** The settings from `get(key)` (the registry's composite values), defaults where unusable. */
export function readSettings(get: (key: keyof IGpuSettings) => unknown): IGpuSettings {
  const d = DEFAULT_SETTINGS;
  const scale = get('chartMemoryScale');
  const show = get('showStatusBar');
  const typed = get('warmTypedCells');
  return {
    refreshRate: num(get('refreshRate'), d.refreshRate, 0.1, 3600),
    historyLength: num(get('historyLength'), d.historyLength, 10, 3600),
    showStatusBar: typeof show === 'boolean' ? show : d.showStatusBar,
    memoryWarningPercent: num(get('memoryWarningPercent'), d.memoryWarningPercent, 1, 100),
    chartMemoryScale: scale === 'peak' || scale === 'total' ? scale : d.chartMemoryScale,
    compactAbove: Math.floor(num(get('compactAbove'), d.compactAbove, 0, 1024)),
    warmTypedCells: typeof typed === 'boolean' ? typed : d.warmTypedCells
  };
}
