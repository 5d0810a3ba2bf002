/**
 * When to try the stream again after it dropped (the server restarted, the network blinked):
 * exponential back-off with a low ceiling, so that the panel is live again within a few seconds
 * of the server's return (a reconnect attempt is one cheap websocket handshake), and a little
 * jitter so that many open tabs do not all knock at the same instant. A refusal (403) is not
 * retried at all (`isRefusal`).
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

/** The HTTP status of a failed request (`.response.status`), or null when the server did not answer. */
export function httpStatus(err: unknown): number | null {
  const status = (err as { response?: { status?: unknown } } | null)?.response?.status;
  return typeof status === 'number' ? status : null;
}

/**
 * The server refused this page (403: its login expired, or this user may not do that). Not an
 * outage: trying again changes nothing until the user reloads the page or logs in again.
 */
export function isRefusal(err: unknown): boolean {
  return httpStatus(err) === 403;
}
