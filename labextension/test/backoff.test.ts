import { describe, expect, it } from 'vitest';

import { backoffDelay, backoffSchedule, DEFAULT_BACKOFF } from '../src/backoff';

describe('backoff', () => {
  it('doubles from half a second up to thirty seconds', () => {
    expect(backoffSchedule(9)).toEqual([500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  });

  it('adds at most the jitter fraction and never passes the ceiling', () => {
    expect(backoffDelay(0, DEFAULT_BACKOFF, () => 1)).toBe(600);
    expect(backoffDelay(0, DEFAULT_BACKOFF, () => 0)).toBe(500);
    expect(backoffDelay(20, DEFAULT_BACKOFF, () => 1)).toBe(30000);
    expect(backoffDelay(-3, DEFAULT_BACKOFF, () => 0)).toBe(500);
  });
});
