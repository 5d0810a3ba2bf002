import { describe, expect, it } from 'vitest';

import {
  basename,
  formatAgo,
  formatBytes,
  formatBytesShort,
  formatClock,
  formatDuration,
  formatMemory,
  formatNumber,
  formatPercent,
  formatPower,
  formatSeconds,
  formatSpan,
  formatTemperature,
  memoryFraction
} from '../src/format';

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

describe('format', () => {
  it('keeps about three significant figures: two decimals below 10, one below 100, none above', () => {
    expect(formatNumber(5.7)).toBe('5.70');
    expect(formatNumber(12.14)).toBe('12.1');
    expect(formatNumber(140.4)).toBe('140');
    expect(formatNumber(0.5)).toBe('0.50');
    // decided on the rounded value: no "10.00" or "100.0"
    expect(formatNumber(9.996)).toBe('10.0');
    expect(formatNumber(99.96)).toBe('100');
    expect(formatNumber(-5.7)).toBe('-5.70');
  });

  it('writes bytes in GiB from one GiB up and MiB below, with the same rule', () => {
    expect(formatBytes(5.7 * GIB)).toBe('5.70 GiB');
    expect(formatBytes(12.1 * GIB)).toBe('12.1 GiB');
    expect(formatBytes(140.4 * GIB)).toBe('140 GiB');
    expect(formatBytes(630 * MIB)).toBe('630 MiB');
    expect(formatBytes(0.5 * MIB)).toBe('0.50 MiB');
    expect(formatBytes(1023.9 * MIB)).toBe('1.00 GiB'); // would round to "1024 MiB"
    expect(formatBytes(0)).toBe('0 MiB');
    expect(formatBytes(null)).toBe('–');
    expect(formatBytes(NaN)).toBe('–');
    expect(formatBytesShort(12.1 * GIB)).toBe('12.1G');
    expect(formatBytesShort(5.7 * GIB)).toBe('5.70G');
    expect(formatBytesShort(630 * MIB)).toBe('630M');
    expect(formatBytesShort(undefined)).toBe('–');
  });

  it('writes used / total', () => {
    expect(formatMemory(5.7 * GIB, 140.4 * GIB)).toBe('5.70 GiB / 140 GiB');
    expect(formatMemory(630 * MIB, 140.4 * GIB)).toBe('630 MiB / 140 GiB');
    expect(formatMemory(undefined, undefined)).toBe('–');
  });

  it('rounds percentages, temperatures and watts; unknown is a dash', () => {
    expect(formatPercent(37.4)).toBe('37%');
    expect(formatPercent(NaN)).toBe('–');
    expect(formatTemperature(39)).toBe('39 °C');
    expect(formatTemperature(null)).toBe('–');
    expect(formatPower(100.4, 700)).toBe('100 / 700 W');
    expect(formatPower(100.4, null)).toBe('100 W');
    expect(formatPower(null, 700)).toBe('–');
  });

  it('writes seconds with the same rule', () => {
    expect(formatSeconds(0.423)).toBe('0.42 s');
    expect(formatSeconds(3.914)).toBe('3.91 s');
    expect(formatSeconds(12.54)).toBe('12.5 s');
    expect(formatSeconds(undefined)).toBe('–');
  });

  it('clamps the memory fraction and refuses a zero total', () => {
    expect(memoryFraction(GIB, 4 * GIB)).toBe(0.25);
    expect(memoryFraction(5, 4)).toBe(1);
    expect(memoryFraction(1, 0)).toBeNull();
  });

  it('names spans, chart times, clock times and paths', () => {
    expect(formatSpan(120)).toBe('2 min');
    expect(formatSpan(90)).toBe('90 s');
    expect(formatSpan(3600)).toBe('1 h');
    expect(formatAgo(0)).toBe('now');
    expect(formatAgo(-30)).toBe('−30 s');
    expect(formatAgo(-60)).toBe('−1 min');
    expect(formatAgo(-90)).toBe('−1.5 min');
    expect(formatClock(new Date(2025, 0, 2, 3, 4, 5).getTime())).toBe('03:04:05');
    expect(basename('a/b/train.ipynb')).toBe('train.ipynb');
    expect(basename('train.ipynb')).toBe('train.ipynb');
  });

  it('writes durations rounded down: seconds, then minutes, then hours and two-digit minutes', () => {
    expect(formatDuration(0)).toBe('0 s');
    expect(formatDuration(45.9)).toBe('45 s');
    expect(formatDuration(60)).toBe('1 min');
    expect(formatDuration(3599)).toBe('59 min');
    expect(formatDuration(3600)).toBe('1 h 00 min');
    expect(formatDuration(7260)).toBe('2 h 01 min');
    expect(formatDuration(26 * 3600 + 5 * 60)).toBe('26 h 05 min');
    expect(formatDuration(null)).toBe('–');
    expect(formatDuration(-1)).toBe('–');
    expect(formatDuration(NaN)).toBe('–');
  });

  it('writes a clock time with or without seconds', () => {
    const ms = new Date(2025, 0, 1, 9, 5, 7).getTime();
    expect(formatClock(ms)).toBe('09:05:07');
    expect(formatClock(ms, false)).toBe('09:05');
  });
});
