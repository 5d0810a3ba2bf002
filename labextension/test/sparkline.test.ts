import { describe, expect, it } from 'vitest';

import { sparklinePath } from '../src/sparkline';

describe('sparklinePath', () => {
  it('spans the width with 0 at the bottom and max at the top', () => {
    expect(sparklinePath([0, 50, 100], 100, 20)).toBe('M0.0 20.0L50.0 10.0L100.0 0.0');
  });

  it('fills from the right while the history is short, and breaks at gaps', () => {
    expect(sparklinePath([100, 100], 100, 10, 100, 5)).toBe('M75.0 0.0L100.0 0.0');
    expect(sparklinePath([10, null, 10], 100, 10)).toBe('M0.0 9.0M100.0 9.0');
  });

  it('clamps values outside 0..max', () => {
    expect(sparklinePath([-5, 150], 10, 10)).toBe('M0.0 10.0L10.0 0.0');
    expect(sparklinePath([], 10, 10)).toBe('');
  });
});
