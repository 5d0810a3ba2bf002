import { describe, expect, it } from 'vitest';

import { DEFAULT_SETTINGS, readSettings } from '../src/settings';

describe('readSettings', () => {
  it('takes what the registry holds', () => {
    const values: Record<string, unknown> = {
      refreshRate: 2,
      historyLength: 300,
      showStatusBar: false,
      memoryWarningPercent: 80,
      chartMemoryScale: 'peak',
      compactAbove: 2,
      warmTypedCells: false
    };
    expect(readSettings(key => values[key])).toEqual(values);
  });

  it('falls back to the defaults for missing or unusable values', () => {
    expect(readSettings(() => undefined)).toEqual(DEFAULT_SETTINGS);
    const odd: Record<string, unknown> = { refreshRate: 'fast', chartMemoryScale: 'max', memoryWarningPercent: 500, compactAbove: 2.7, warmTypedCells: 'yes' };
    const read = readSettings(key => odd[key]);
    expect(read.refreshRate).toBe(1);
    expect(read.chartMemoryScale).toBe('total');
    expect(read.memoryWarningPercent).toBe(100);
    expect(read.compactAbove).toBe(2);
    expect(read.warmTypedCells).toBe(true);
  });
});
