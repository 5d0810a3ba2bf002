/**
 * When to try the stream again after it dropped (the server restarted, the network blinked):
 * exponential back-off with a low ceiling, so that the panel is live again within a few seconds
 * of the server's return (a reconnect attempt is one cheap websocket handshake), and a little
 * jitter so that many open tabs do not all knock at the same instant.
 */

export interface IBackoffOptions {
  /** First delay, milliseconds. */
  initial: number;
  /** Each further attempt waits this many times longer. */
  factor: number;
  /** Ceiling, milliseconds (before the jitter: at the ceiling, tabs must not knock in step). */
  max: number;
  /** Up to this fraction of the delay is added at random (0 = none). */
  jitter: number;
}

/** 0.5, 1, 2, 4 s, then every 5 s. */
export const DEFAULT_BACKOFF: IBackoffOptions = { initial: 500, factor: 2, max: 5000, jitter: 0.2 };

/** Milliseconds to wait before reconnect attempt `attempt` (0 = the first retry). */
export function backoffDelay(
  attempt: number,
  options: IBackoffOptions = DEFAULT_BACKOFF,
  random: () => number = Math.random
): number {
  const n = Math.max(0, Math.floor(attempt));
  const base = Math.min(options.max, options.initial * Math.pow(options.factor, n));
  return Math.round(base * (1 + options.jitter * random()));
}

/** The delays of the first `count` attempts without jitter, for docs and tests. */
export function backoffSchedule(count: number, options: IBackoffOptions = DEFAULT_BACKOFF): number[] {
  return Array.from({ length: count }, (_, i) => backoffDelay(i, { ...options, jitter: 0 }));
}
