import { describe, expect, it } from 'vitest';

import {
  basename,
  formatBytes,
  formatBytesShort,
  formatMemory,
  formatPercent,
  formatPower,
  formatSpan,
  formatTemperature,
  memoryFraction
} from '../src/format';

const GIB = 1024 ** 3;

describe('format', () => {
  it('writes bytes in GiB above one GiB and MiB below', () => {
    expect(formatBytes(12.1 * GIB)).toBe('12.1 GiB');
    expect(formatBytes(630 * 1024 ** 2)).toBe('630 MiB');
    expect(formatBytes(0)).toBe('0 MiB');
    expect(formatBytes(null)).toBe('–');
    expect(formatBytesShort(12.1 * GIB)).toBe('12.1G');
    expect(formatBytesShort(630 * 1024 ** 2)).toBe('630M');
  });

  it('writes used / total', () => {
    expect(formatMemory(1.2 * GIB, 140.4 * GIB)).toBe('1.2 GiB / 140.4 GiB');
    expect(formatMemory(undefined, undefined)).toBe('–');
  });

  it('rounds percentages, temperatures and watts; unknown is a dash', () => {
    expect(formatPercent(37.4)).toBe('37%');
    expect(formatPercent(NaN)).toBe('–');
    expect(formatTemperature(29)).toBe('29 °C');
    expect(formatPower(100.4, 700)).toBe('100 / 700 W');
    expect(formatPower(100.4, null)).toBe('100 W');
    expect(formatPower(null, 700)).toBe('–');
  });

  it('clamps the memory fraction and refuses a zero total', () => {
    expect(memoryFraction(GIB, 4 * GIB)).toBe(0.25);
    expect(memoryFraction(5, 4)).toBe(1);
    expect(memoryFraction(1, 0)).toBeNull();
  });

  it('names spans and paths', () => {
    expect(formatSpan(120)).toBe('2 min');
    expect(formatSpan(90)).toBe('90 s');
    expect(basename('a/b/train.ipynb')).toBe('train.ipynb');
    expect(basename('train.ipynb')).toBe('train.ipynb');
  });
});
