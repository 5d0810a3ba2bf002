import { describe, expect, it } from 'vitest';

import { GpuStream, ISocket } from '../src/stream';
import { ISnapshot } from '../src/types';
import { NO_GPU, twoGpus } from './fixtures';

class FakeSocket implements ISocket {
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: unknown) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  closed = false;
  constructor(public url: string) {}
  close(): void {
    this.closed = true;
  }
  // what the server does
  open(): void {
    this.onopen?.({});
  }
  send(msg: object): void {
    this.onmessage?.({ data: JSON.stringify(msg) });
  }
  drop(): void {
    this.onclose?.({});
  }
}

function setup(fetchSnapshot?: () => Promise<ISnapshot>) {
  const sockets: FakeSocket[] = [];
  const timers: { fn: () => void; ms: number; cleared: boolean }[] = [];
  const stream = new GpuStream({
    url: i => `ws://x/gpuctx/api/stream?interval=${i}`,
    openSocket: url => {
      const s = new FakeSocket(url);
      sockets.push(s);
      return s;
    },
    fetchSnapshot,
    interval: 1,
    random: () => 0,
    setTimeout: (fn, ms) => {
      const t = { fn, ms, cleared: false };
      timers.push(t);
      return t;
    },
    clearTimeout: t => {
      (t as { cleared: boolean }).cleared = true;
    }
  });
  const got: ISnapshot[] = [];
  stream.snapshotChanged.connect((_, s) => got.push(s));
  return { stream, sockets, timers, got };
}

describe('GpuStream', () => {
  it('opens only while someone needs data, and closes when nobody does', () => {
    const { stream, sockets } = setup();
    expect(sockets).toHaveLength(0);
    stream.demand('panel', true);
    stream.demand('statusbar', true);
    expect(sockets).toHaveLength(1);
    expect(sockets[0].url).toBe('ws://x/gpuctx/api/stream?interval=1');
    stream.demand('panel', false);
    expect(sockets[0].closed).toBe(false);
    stream.demand('statusbar', false);
    expect(sockets[0].closed).toBe(true);
    expect(stream.state).toBe('idle');
  });

  it('publishes snapshots and takes the granted interval from hello', () => {
    const { stream, sockets, got } = setup();
    stream.demand('panel', true);
    sockets[0].open();
    expect(stream.state).toBe('open');
    sockets[0].send({ type: 'hello', interval: 0.5 });
    sockets[0].send({ type: 'snapshot', ...NO_GPU });
    sockets[0].send({ type: 'snapshot', ...twoGpus(90) }); // older than the last: ignored
    expect(stream.grantedInterval).toBe(0.5);
    expect(got).toHaveLength(1);
    expect(stream.snapshot?.reason).toContain('libnvidia-ml');
  });

  it('reconnects with exponential back-off and resets it after a message', () => {
    const { stream, sockets, timers } = setup();
    stream.demand('panel', true);
    sockets[0].drop();
    expect(stream.state).toBe('waiting');
    expect(timers.map(t => t.ms)).toEqual([500]);
    timers[0].fn();
    expect(sockets).toHaveLength(2);
    sockets[1].drop();
    timers[1].fn();
    sockets[2].drop();
    expect(timers.map(t => t.ms)).toEqual([500, 1000, 2000]);
    timers[2].fn();
    sockets[3].open();
    sockets[3].send({ type: 'hello', interval: 1 });
    expect(stream.attempts).toBe(0);
    sockets[3].drop();
    expect(timers[3].ms).toBe(500);
  });

  it('stops retrying when nobody needs data any more', () => {
    const { stream, sockets, timers } = setup();
    stream.demand('panel', true);
    sockets[0].drop();
    stream.demand('panel', false);
    expect(timers[0].cleared).toBe(true);
    expect(stream.state).toBe('idle');
  });

  it('reconnects with a new interval', () => {
    const { stream, sockets } = setup();
    stream.demand('panel', true);
    stream.setInterval(5);
    expect(sockets[0].closed).toBe(true);
    expect(sockets[1].url).toContain('interval=5');
  });

  it('reads the snapshot over REST when it starts', async () => {
    const { stream, got } = setup(async () => NO_GPU);
    stream.demand('panel', true);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(got).toEqual([NO_GPU]);
  });
});
