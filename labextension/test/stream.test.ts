import { describe, expect, it } from 'vitest';

import { GpuStream } from '../src/stream';
import { ISnapshot } from '../src/types';
import { NO_GPU, twoGpus } from './fixtures';
import { FakeSocket } from './sockets';

function setup(fetchSnapshot?: () => Promise<ISnapshot>) {
  const sockets: FakeSocket[] = [];
  const timers: { fn: () => void; ms: number; cleared: boolean }[] = [];
  const stream = new GpuStream({
    url: (i, detail) =>
      `ws://x/gpuctx/api/stream?interval=${i}` +
      (detail.history ? `&history=${detail.history}` : '') +
      (detail.throughput ? '&throughput=1' : ''),
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
    sockets[0].open();
    stream.demand('panel', false);
    expect(sockets[0].closed).toBe(false);
    stream.demand('statusbar', false);
    expect(sockets[0].closed).toBe(true);
    expect(stream.state).toBe('idle');
  });

  it('lets the stream go once the page has been hidden a while, and comes back at once, history and all', async () => {
    let reads = 0;
    const { stream, sockets, timers } = setup(async () => {
      reads++;
      return twoGpus(100);
    });
    stream.setDetail({ history: 120, throughput: false });
    stream.demand('panel', true);
    sockets[0].open();
    stream.setPageHidden(true); // another browser tab
    stream.setPageHidden(false); // a glance: back within the grace period
    expect(timers.map(t => [t.ms, t.cleared])).toEqual([[5000, true]]);
    expect(sockets[0].closed).toBe(false);
    stream.setPageHidden(true);
    expect(sockets[0].closed).toBe(false);
    timers[1].fn(); // hidden for the whole grace period
    expect(sockets[0].closed).toBe(true);
    expect(stream.state).toBe('idle');
    expect(stream.away).toBe(true);
    stream.demand('statusbar', true); // a page nobody sees opens nothing, whatever it shows
    expect(sockets).toHaveLength(1);
    const before = reads;
    stream.setPageHidden(false);
    await Promise.resolve();
    expect(sockets).toHaveLength(2);
    expect(sockets[1].url).toBe('ws://x/gpuctx/api/stream?interval=1&history=120'); // the gap, filled
    expect(reads).toBe(before + 1);
    expect(stream.away).toBe(false);
  });

  it('closes a socket that is still connecting only once it is open (no browser error)', () => {
    // Chromium logs "WebSocket is closed before the connection is established" for a socket
    // closed during its handshake: the page's demand flips like this while JupyterLab loads.
    const { stream, sockets, got } = setup();
    stream.demand('panel', true);
    stream.demand('panel', false);
    expect(sockets[0].closed).toBe(false);
    expect(stream.state).toBe('idle');
    stream.demand('panel', true);
    expect(sockets).toHaveLength(2); // a new connection for the new demand, the old one let go
    sockets[0].open();
    expect(sockets[0].closed).toBe(true);
    sockets[0].send({ type: 'snapshot', ...NO_GPU }); // too late: nobody listens to it
    expect(got).toHaveLength(0);
    sockets[1].open();
    expect(sockets[1].closed).toBe(false);
  });

  it('asks for history and throughput, hands the history on, and reconnects to ask for more', () => {
    const { stream, sockets } = setup();
    const histories: unknown[] = [];
    stream.historyReceived.connect((_, h) => histories.push(h));
    stream.setDetail({ history: 120, throughput: false });
    stream.demand('panel', true);
    expect(sockets[0].url).toBe('ws://x/gpuctx/api/stream?interval=1&history=120');
    sockets[0].open();
    sockets[0].send({ type: 'history', time: 100, seconds: 120, gpus: {} });
    expect(histories).toHaveLength(1);
    expect(stream.snapshot).toBeNull(); // a history is not a snapshot
    stream.setDetail({ history: 60, throughput: false }); // less: the page draws less, no reconnect
    expect(sockets).toHaveLength(1);
    stream.setDetail({ history: 3600, throughput: true }); // a dashboard opened
    expect(sockets[0].closed).toBe(true);
    expect(sockets[1].url).toBe('ws://x/gpuctx/api/stream?interval=1&history=3600&throughput=1');
    sockets[1].open();
    stream.setDetail({ history: 120, throughput: false }); // it closed: the server stops reading links
    expect(sockets[1].closed).toBe(true);
    expect(sockets).toHaveLength(3);
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
    sockets[0].open();
    stream.setInterval(5);
    expect(sockets[0].closed).toBe(true);
    expect(sockets[1].url).toContain('interval=5');
  });

  it('stops knocking when the server refuses the page (403), and tries again on a new demand', async () => {
    // A browser says nothing about why a websocket failed; the REST read's 403 does.
    const refused = () => Promise.reject(Object.assign(new Error('Forbidden'), { response: { status: 403 } }));
    const { stream, sockets, timers } = setup(refused);
    stream.demand('panel', true);
    sockets[0].drop(); // the handshake was refused
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(stream.state).toBe('refused');
    expect(timers.filter(t => !t.cleared)).toHaveLength(0); // no retry scheduled
    stream.demand('statusbar', true);
    expect(sockets).toHaveLength(1);
    stream.demand('panel', false);
    stream.demand('statusbar', false);
    expect(stream.state).toBe('idle');
    stream.demand('panel', true); // shown again (or reloaded, logged in again): one new try
    expect(sockets).toHaveLength(2);
  });

  it('an outage is retried as before: a read that gets no answer is no refusal', async () => {
    const { stream, sockets, timers } = setup(() => Promise.reject(new TypeError('Failed to fetch')));
    stream.demand('panel', true);
    sockets[0].drop();
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(stream.state).toBe('waiting');
    timers[0].fn();
    expect(sockets).toHaveLength(2);
  });

  it('reads the snapshot over REST when it starts', async () => {
    const { stream, got } = setup(async () => NO_GPU);
    stream.demand('panel', true);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(got).toEqual([NO_GPU]);
  });
});
