import { describe, expect, it } from 'vitest';

import { backoffDelay, backoffSchedule, DEFAULT_BACKOFF } from '../src/backoff';

describe('backoff', () => {
  it('doubles from half a second up to five seconds, so a returning server is found within seconds', () => {
    expect(backoffSchedule(8)).toEqual([500, 1000, 2000, 4000, 5000, 5000, 5000, 5000]);
  });

  it('adds at most the jitter fraction, also at the ceiling (many tabs do not knock in step)', () => {
    expect(backoffDelay(0, DEFAULT_BACKOFF, () => 1)).toBe(600);
    expect(backoffDelay(0, DEFAULT_BACKOFF, () => 0)).toBe(500);
    expect(backoffDelay(3, DEFAULT_BACKOFF, () => 1)).toBe(4800);
    expect(backoffDelay(20, DEFAULT_BACKOFF, () => 1)).toBe(6000);
    expect(backoffDelay(20, DEFAULT_BACKOFF, () => 0)).toBe(5000);
    expect(backoffDelay(-3, DEFAULT_BACKOFF, () => 0)).toBe(500);
  });
});
