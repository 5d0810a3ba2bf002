/**
 * The controller against a fake notebook source, a real GpuStream on fake sockets, fake kernel
 * views and fake timers (the kernel-view Poll's timers are the global ones, which vitest fakes).
 */
import { Signal } from '@lumino/signaling';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import {
  cullNotice,
  GpuController,
  IControllerOptions,
  INotebookRef,
  INotebookSource,
  INotice,
  releaseNotice,
  suspendNotice
} from '../src/controller';
import { DeviceHistory } from '../src/history';
import { kernelRows, notebookActions, REFUSED_TEXT } from '../src/model';
import { DEFAULT_SETTINGS } from '../src/settings';
import { GpuStream } from '../src/stream';
import { IKernelView, ISnapshot } from '../src/types';
import { at, GIB, holdersSnapshot, twoGpus } from './fixtures';
import { FakeSocket } from './sockets';

class FakeNotebooks implements INotebookSource {
  nb: INotebookRef | null = null;
  readonly changed = new Signal<this, void>(this);
  current(): INotebookRef | null {
    return this.nb;
  }
  show(nb: INotebookRef | null): void {
    this.nb = nb;
    this.changed.emit();
  }
}

function notebook(kernelId: string | null, name = 'train.ipynb'): INotebookRef {
  return { name, path: `work/${name}`, kernelId, kernelName: 'Python 3', kernelStatus: 'idle' };
}

/** An error as @jupyterlab/services throws it: with `.response.status` when the server answered. */
function httpError(status: number, message: string): Error {
  return Object.assign(new Error(message), { response: { status } });
}

const OK: IKernelView = { status: 'ok', device: 0, device_source: 'the server (least-used)', memory: [] };

type Answer = (kernelId: string) => Promise<IKernelView>;

function setup(over: Partial<IControllerOptions> = {}, fetchSnapshot?: () => Promise<ISnapshot>) {
  const sockets: FakeSocket[] = [];
  const stream = new GpuStream({
    url: i => `ws://x/gpuctx/api/stream?interval=${i}`,
    openSocket: () => {
      const s = new FakeSocket();
      sockets.push(s);
      return s;
    },
    fetchSnapshot,
    interval: 1,
    random: () => 0
  });
  const notebooks = new FakeNotebooks();
  const requests: { kernelId: string; at: number }[] = [];
  let answer: Answer = async () => OK;
  const actions: [string, string][] = [];
  const errors: [string, string][] = [];
  let confirmed = true;
  const controller = new GpuController({
    stream,
    history: new DeviceHistory(120, 1),
    notebooks,
    fetchKernelView: kernelId => {
      requests.push({ kernelId, at: Date.now() });
      return answer(kernelId);
    },
    kernelAction: async (kernelId, api) => {
      actions.push([kernelId, api]);
      return { status: 'ok' };
    },
    confirm: async () => confirmed,
    reportError: (title, message) => errors.push([title, message]),
    random: () => 0,
    ...over
  });
  controller.setStatusVisible(true); // a page whose status bar is shown, as JupyterLab's is
  return {
    controller,
    stream,
    sockets,
    notebooks,
    requests,
    actions,
    errors,
    answer: (a: Answer) => {
      answer = a;
    },
    confirm: (yes: boolean) => {
      confirmed = yes;
    },
    /** The gaps between kernel-view requests, ms. */
    gaps: () => requests.slice(1).map((r, i) => r.at - requests[i].at)
  };
}

beforeEach(() => {
  vi.useFakeTimers();
  vi.setSystemTime(new Date(2025, 0, 1, 12, 0, 0));
});

afterEach(() => {
  vi.useRealTimers();
});

describe('GpuController: the kernel-view poll', () => {
  it("asks the active notebook's kernel at once, then every 5 s while someone looks", async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests.map(r => r.kernelId)).toEqual(['k1']);
    expect(t.controller.kernelView).toEqual(OK);
    await vi.advanceTimersByTimeAsync(15000);
    expect(t.requests).toHaveLength(4);
    expect(t.gaps()).toEqual([5000, 5000, 5000]);
    // nobody looks: the status item is turned off and the panel is hidden
    t.controller.configure({ ...DEFAULT_SETTINGS, showStatusBar: false });
    expect(t.controller.polling).toBe(false);
    await vi.advanceTimersByTimeAsync(60000);
    expect(t.requests).toHaveLength(4);
    // the panel is shown: asked again at once
    t.controller.setPanelVisible(true);
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests).toHaveLength(5);
    t.controller.dispose();
  });

  it('does not ask for a notebook without a kernel, nor on a non-notebook tab', async () => {
    const t = setup();
    t.notebooks.show(notebook(null));
    t.controller.setPanelVisible(true);
    await vi.advanceTimersByTimeAsync(20000);
    expect(t.requests).toHaveLength(0);
    expect(t.controller.statusShown).toBe(true);
    t.notebooks.show(null); // Settings is the active tab
    expect(t.controller.statusShown).toBe(false);
    expect(t.controller.polling).toBe(false);
    t.controller.dispose();
  });

  it('stops asking once the server says the kernel is gone (404)', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    t.answer(async () => {
      throw httpError(404, "no kernel 'k1' on this server");
    });
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests).toHaveLength(1);
    expect(t.controller.kernelView?.status).toBe('gone');
    expect(t.controller.polling).toBe(false);
    await vi.advanceTimersByTimeAsync(120000);
    expect(t.requests).toHaveLength(1);
    // showing the panel does not revive it
    t.controller.setPanelVisible(true);
    await vi.advanceTimersByTimeAsync(30000);
    expect(t.requests).toHaveLength(1);
    // a new kernel in the same notebook is asked again
    t.answer(async () => OK);
    t.notebooks.show(notebook('k2'));
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests.map(r => r.kernelId)).toEqual(['k1', 'k2']);
    expect(t.controller.polling).toBe(true);
    t.controller.dispose();
  });

  it('after "Shut down" (confirmed) asks no more; Cancel leaves the kernel alone', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    t.confirm(false);
    expect(await t.controller.runAction({ kernelId: 'k1', action: 'shutdown', label: 'train.ipynb' })).toBe(false);
    expect(t.actions).toEqual([]); // Cancel leaves the kernel alone
    expect(t.controller.polling).toBe(true);
    t.confirm(true);
    expect(await t.controller.runAction({ kernelId: 'k1', action: 'shutdown', label: 'train.ipynb' })).toBe(true);
    expect(t.actions).toEqual([['k1', 'shutdown']]);
    expect(t.controller.kernelView?.status).toBe('gone');
    expect(t.controller.polling).toBe(false);
    await vi.advanceTimersByTimeAsync(60000);
    expect(t.requests).toHaveLength(1); // not one request (and no 404 in the console) after it
    // the status bar names no GPU for it any more
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    expect(t.controller.statusView()).toMatchObject({ state: 'no-kernel', text: 'GPU –' });
    t.controller.dispose();
  });

  it('asks again at once after a restart or an interrupt', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    await t.controller.runAction({ kernelId: 'k1', action: 'restart', label: 'train.ipynb' });
    expect(t.controller.kernelView).toBeNull(); // "asking the kernel…" until it answers
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests).toHaveLength(2);
    expect(t.controller.kernelView).toEqual(OK);
    t.controller.dispose();
  });

  it("drops the old process's late answer after a restart (the same kernel id)", async () => {
    const t = setup();
    let n = 0;
    let late: (v: IKernelView) => void = () => undefined;
    t.answer(() => (++n === 2 ? new Promise<IKernelView>(resolve => (late = resolve)) : Promise.resolve({ ...OK, device: 1 })));
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    await vi.advanceTimersByTimeAsync(5000); // the next question goes to the process about to be restarted
    expect(n).toBe(2);
    await t.controller.runAction({ kernelId: 'k1', action: 'restart', label: 'train.ipynb' });
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.kernelView?.device).toBe(1); // the restarted process answered
    late({ kernel_id: 'k1', status: 'no-answer', reason: 'the kernel did not answer within 2 s' });
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.kernelView?.status).toBe('ok');
    t.controller.dispose();
  });

  it('reports a refused action in the server’s words, and a lost server in plain words', async () => {
    const t = setup({
      kernelAction: async () => {
        throw httpError(403, 'kernel actions are turned off on this server');
      }
    });
    await t.controller.runAction({ kernelId: 'k9', action: 'restart', label: 'a.ipynb' });
    expect(t.errors).toEqual([['Could not restart the kernel of a.ipynb', 'kernel actions are turned off on this server']]);
    const u = setup({
      kernelAction: async () => {
        throw new TypeError('Failed to fetch');
      }
    });
    await u.controller.runAction({ kernelId: 'k9', action: 'interrupt', label: 'a.ipynb' });
    expect(u.errors[0][1]).not.toContain('Failed to fetch');
    expect(u.errors[0][1]).toContain('The Jupyter server did not answer');
    const v = setup({
      kernelAction: async () => {
        throw new Error('Kernel is dead'); // the kernel connection's own refusal: the server is fine
      }
    });
    await v.controller.runAction({ kernelId: 'k9', action: 'interrupt', label: 'a.ipynb' });
    expect(v.errors[0][1]).toBe('Kernel is dead');
    t.controller.dispose();
    u.controller.dispose();
    v.controller.dispose();
  });

  it('says what to do when an action is refused with a bare 403 (the login expired)', async () => {
    const t = setup({
      kernelAction: async () => {
        throw httpError(403, 'Forbidden');
      }
    });
    await t.controller.runAction({ kernelId: 'k9', action: 'interrupt', label: 'a.ipynb' });
    expect(t.errors).toEqual([['Could not interrupt the kernel of a.ipynb', REFUSED_TEXT]]);
    t.controller.dispose();
  });

  it('a notebook shown again after its kernel went says so, not "asking…" for ever', async () => {
    const t = setup();
    t.answer(async kernelId => {
      if (kernelId === 'k1') {
        throw httpError(404, 'no kernel');
      }
      return OK;
    });
    t.notebooks.show(notebook('k1', 'a.ipynb'));
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.kernelView?.status).toBe('gone');
    t.notebooks.show(notebook('k2', 'b.ipynb'));
    t.notebooks.show(notebook('k1', 'a.ipynb'));
    await vi.advanceTimersByTimeAsync(10000);
    expect(t.controller.kernelView?.status).toBe('gone');
    expect(t.controller.statusView().text).toBe('GPU –');
    expect(t.requests.filter(r => r.kernelId === 'k1')).toHaveLength(1);
    t.controller.dispose();
  });

  it('backs off while the server does not answer, capped at 30 s, and is back at once when it returns', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    t.answer(async () => {
      throw new TypeError('Failed to fetch');
    });
    await vi.advanceTimersByTimeAsync(5000 + 5000 + 10000 + 20000 + 30000 + 30000);
    expect(t.gaps()).toEqual([5000, 5000, 10000, 20000, 30000, 30000]);
    expect(t.controller.health.outage).toBe(true);
    // the last good answer stays on show, never the browser's error text
    expect(t.controller.kernelView).toEqual(OK);
    // the stream reconnects: the kernel is asked at once, not 30 s later
    t.answer(async () => OK);
    t.stream.demand('test', true);
    const before = t.requests.length;
    t.sockets[t.sockets.length - 1].open();
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests).toHaveLength(before + 1);
    expect(t.controller.health.outage).toBe(false);
    await vi.advanceTimersByTimeAsync(5000);
    expect(t.requests).toHaveLength(before + 2); // the period again
    t.controller.dispose();
  });

  it('says the server is unreachable, never "Failed to fetch", when it never answered', async () => {
    const t = setup();
    t.answer(async () => {
      throw new TypeError('Failed to fetch');
    });
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.kernelView?.status).toBe('unreachable');
    expect(JSON.stringify(t.controller.kernelView)).not.toContain('Failed to fetch');
    t.controller.dispose();
  });

  it('switches notebooks: asks the new kernel at once and drops a late answer for the old one', async () => {
    const t = setup();
    let release: (v: IKernelView) => void = () => undefined;
    t.answer(kernelId =>
      kernelId === 'k1' ? new Promise<IKernelView>(resolve => (release = resolve)) : Promise.resolve({ ...OK, device: 1 })
    );
    t.notebooks.show(notebook('k1', 'a.ipynb'));
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests.map(r => r.kernelId)).toEqual(['k1']);
    const changes: (string | null)[] = [];
    t.controller.notebookChanged.connect(() => changes.push(t.controller.notebook?.name ?? null));
    t.notebooks.show(notebook('k2', 'b.ipynb'));
    expect(t.controller.kernelView).toBeNull(); // nothing of a.ipynb's kernel shown for b.ipynb
    await vi.advanceTimersByTimeAsync(0);
    expect(t.requests.map(r => r.kernelId)).toEqual(['k1', 'k2']);
    expect(t.controller.kernelView?.device).toBe(1);
    release({ ...OK, device: 0 }); // a.ipynb's kernel answers late
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.kernelView?.device).toBe(1);
    expect(changes[0]).toBe('b.ipynb');
    // from now on only k2 is asked
    await vi.advanceTimersByTimeAsync(10000);
    expect(new Set(t.requests.slice(2).map(r => r.kernelId))).toEqual(new Set(['k2']));
    t.controller.dispose();
  });
});

describe('GpuController: the stream, staleness and the status bar', () => {
  it('streams and asks nothing while the status bar is hidden and no panel shows, and resumes when it shows', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    expect(t.sockets).toHaveLength(1);
    t.sockets[0].open();
    t.controller.setStatusVisible(false); // View → Show Status Bar, unticked
    expect(t.sockets[0].closed).toBe(true);
    expect(t.stream.state).toBe('idle');
    expect(t.controller.polling).toBe(false);
    const asked = t.requests.length;
    await vi.advanceTimersByTimeAsync(60000);
    expect(t.sockets).toHaveLength(1);
    expect(t.requests).toHaveLength(asked);
    t.controller.setStatusVisible(true); // shown again: live again at once
    await vi.advanceTimersByTimeAsync(0);
    expect(t.sockets).toHaveLength(2);
    expect(t.requests).toHaveLength(asked + 1);
    t.controller.setPanelVisible(true);
    t.controller.setStatusVisible(false); // the panel alone is reason enough
    expect(t.sockets).toHaveLength(2);
    expect(t.sockets[1].closed).toBe(false);
    t.controller.dispose();
  });

  it('opens the stream for the panel or the status item, and feeds the history', () => {
    const t = setup();
    expect(t.sockets).toHaveLength(0);
    t.notebooks.show(notebook('k1'));
    expect(t.sockets).toHaveLength(1); // the status item is shown for a notebook
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    expect(t.controller.history.points('GPU-aaaa')).toHaveLength(1);
    t.notebooks.show(null);
    expect(t.sockets[0].closed).toBe(true);
    t.controller.dispose();
  });

  it('marks the data stale after two intervals without a snapshot, and fresh on the next', async () => {
    const t = setup();
    const health: boolean[] = [];
    t.controller.healthChanged.connect((_, h) => health.push(h.stale));
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'hello', interval: 1 });
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    const received = Date.now();
    await vi.advanceTimersByTimeAsync(1999);
    expect(t.controller.health.stale).toBe(false);
    expect(t.controller.health.outage).toBe(false);
    await vi.advanceTimersByTimeAsync(2);
    expect(t.controller.health.stale).toBe(true);
    // the socket is still open (a hung server): stale data is reported as an outage all the same
    expect(t.controller.health.outage).toBe(true);
    expect(t.controller.health.lastUpdate).toBe(received);
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(103) });
    expect(t.controller.health.stale).toBe(false);
    expect(t.controller.health.outage).toBe(false);
    expect(health.filter((v, i) => i === 0 || v !== health[i - 1])).toEqual([false, true, false]);
    t.controller.dispose();
  });

  it('is not stale at once when the stream starts again after a pause (a tab shown again)', async () => {
    const t = setup();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'hello', interval: 1 });
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    t.controller.setPanelVisible(false); // nothing shows the data: the stream stops
    await vi.advanceTimersByTimeAsync(60000);
    t.controller.setPanelVisible(true); // started again: its data comes within an interval
    expect(t.controller.health.stale).toBe(false);
    expect(t.controller.health.state.kind).not.toBe('stale');
    await vi.advanceTimersByTimeAsync(2001); // ... and when none comes, that is stale as ever
    expect(t.controller.health.stale).toBe(true);
    t.controller.dispose();
  });

  it('uses the interval the server granted', async () => {
    const t = setup();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'hello', interval: 5 });
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    await vi.advanceTimersByTimeAsync(9000);
    expect(t.controller.health.stale).toBe(false);
    await vi.advanceTimersByTimeAsync(1001);
    expect(t.controller.health.stale).toBe(true);
    t.controller.dispose();
  });

  it('reports an outage while the stream retries, and reconnects within seconds', async () => {
    const t = setup();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].drop();
    expect(t.controller.health).toMatchObject({ connection: 'waiting', outage: true });
    for (let i = 1; i < 8; i++) {
      await vi.advanceTimersByTimeAsync(5000); // capped back-off: at least one attempt every 5 s
      expect(t.sockets.length).toBeGreaterThan(i);
      t.sockets[t.sockets.length - 1].drop();
    }
    await vi.advanceTimersByTimeAsync(5000);
    t.sockets[t.sockets.length - 1].open();
    expect(t.controller.health).toMatchObject({ connection: 'open', outage: false });
    t.controller.dispose();
  });

  it('says access was refused, never "offline", when the server answers 403, and stops knocking', async () => {
    // The page's login expired: the socket's handshake fails, and the REST read says why.
    const forbidden = () => httpError(403, 'Forbidden');
    const t = setup({}, () => Promise.reject(forbidden()));
    t.answer(() => Promise.reject(forbidden()));
    t.notebooks.show(notebook('k1'));
    t.controller.setPanelVisible(true);
    t.sockets[0].drop();
    await vi.advanceTimersByTimeAsync(0);
    const state = t.controller.health.state;
    expect(state).toMatchObject({ kind: 'refused', down: true, badge: 'access refused' });
    expect(state.text).toContain('Log in again if asked, then reload the page');
    expect(state.text).not.toMatch(/offline|retrying/i);
    expect(t.controller.statusView()).toMatchObject({ text: 'GPU …', badge: 'access refused' });
    expect(t.controller.kernelView).toMatchObject({ status: 'refused' });
    expect(t.controller.kernelView?.reason).toContain('reload the page');
    await vi.advanceTimersByTimeAsync(120000);
    expect(t.sockets).toHaveLength(1); // no reconnects
    expect(t.requests).toHaveLength(1); // the kernel is not asked again
    expect(t.controller.health.state.kind).toBe('refused');
    t.controller.dispose();
  });

  it("a kernel this page may not read (403) is said so, not asked again, and offers no actions", async () => {
    const t = setup();
    t.answer(() => Promise.reject(httpError(403, 'Forbidden')));
    t.notebooks.show(notebook('k1'));
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.health.state.kind).toBe('live'); // the GPU data still flows
    expect(t.controller.kernelView).toMatchObject({ status: 'refused' });
    await vi.advanceTimersByTimeAsync(60000);
    expect(t.requests).toHaveLength(1);
    expect(kernelRows(t.controller.kernelView)).toEqual([{ label: 'GPU view', value: REFUSED_TEXT }]);
    const input = { kernelId: 'k1', kernelStatus: 'idle', snapshot: null, down: false };
    expect(notebookActions({ ...input, view: t.controller.kernelView })).toEqual([]);
    t.controller.dispose();
  });

  it('names the GPU in the status bar only once the kernel shows it uses one', async () => {
    const t = setup();
    t.answer(async () => ({ status: 'ok', device: null, cuda_started: [], memory: [] }));
    t.notebooks.show(notebook('k-new'));
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    expect(t.controller.statusView().text).toBe('GPU …'); // not asked yet
    await vi.advanceTimersByTimeAsync(0);
    expect(t.controller.statusView()).toMatchObject({ state: 'none', text: 'GPU –' });
    t.answer(async () => ({ status: 'ok', device: null, cuda_started: ['torch'], memory: [] }));
    await vi.advanceTimersByTimeAsync(5000);
    expect(t.controller.statusView()).toMatchObject({ state: 'gpu', text: 'GPU0 37% 12.1G' });
    t.controller.dispose();
  });

  it('says for how long the data is stale, every second, and that the server is offline once the stream drops', async () => {
    const t = setup();
    const states: string[] = [];
    t.controller.healthChanged.connect((_, h) => states.push(h.state.text));
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'hello', interval: 1 });
    expect(t.controller.health.state.kind).toBe('connecting');
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100) });
    expect(t.controller.health.state).toMatchObject({ kind: 'live', text: 'Live' });
    await vi.advanceTimersByTimeAsync(5001);
    expect(t.controller.health.state.kind).toBe('stale');
    expect(t.controller.health.state.text).toMatch(/^Stale for 5 s: no data from the server since \d\d:\d\d:\d\d$/);
    await vi.advanceTimersByTimeAsync(1000);
    expect(states[states.length - 1]).toMatch(/^Stale for 6 s/); // told without a new snapshot
    t.sockets[0].drop();
    expect(t.controller.health.state).toMatchObject({ kind: 'offline', down: true, badge: 'offline' });
    expect(t.controller.statusView().badge).toBe('offline');
    await vi.advanceTimersByTimeAsync(600);
    t.sockets[1].open();
    t.sockets[1].send({ type: 'snapshot', ...twoGpus(110) });
    expect(t.controller.health.state.kind).toBe('live');
    const count = states.length;
    await vi.advanceTimersByTimeAsync(1500);
    expect(states).toHaveLength(count); // no ticking while live
    t.controller.dispose();
  });

  it('says "replay" for a replayed trace, in the state and the status badge', () => {
    const t = setup();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(100), replay: { source: '/x/h200-trace.jsonl', recorded: '2026-11-29' } });
    expect(t.controller.health.state).toMatchObject({
      kind: 'replay',
      detail: 'h200-trace.jsonl, recorded 2026-11-29',
      badge: 'replay'
    });
    t.controller.dispose();
  });

  it("merges the server's history before the first snapshot, so the charts start full", () => {
    const t = setup();
    const seen: number[] = [];
    t.controller.historyChanged.connect(() => seen.push(t.controller.history.points('GPU-aaaa').length));
    t.controller.setPanelVisible(true);
    expect(t.stream.detail).toEqual({ history: 120, throughput: false });
    t.sockets[0].open();
    t.sockets[0].send({ type: 'hello', interval: 1 });
    const t0 = 1000;
    t.sockets[0].send({
      type: 'history',
      time: t0 + 60,
      seconds: 120,
      gpus: { 'GPU-aaaa': { t: Array.from({ length: 60 }, (_, i) => t0 + i), utilization: Array(60).fill(50) } }
    });
    expect(seen).toEqual([60]);
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(t0 + 60) });
    expect(t.controller.history.points('GPU-aaaa')).toHaveLength(61);
    t.controller.dispose();
  });

  it('asks for the last hour and link throughput while a dashboard is open, and stops after', () => {
    const t = setup();
    t.controller.setDashboardOpen(true);
    expect(t.sockets).toHaveLength(1); // the stream runs for the dashboard alone
    expect(t.stream.detail).toEqual({ history: 3600, throughput: true });
    expect(t.controller.history.keep).toBe(3600);
    t.sockets[0].open();
    t.controller.setDashboardOpen(false);
    expect(t.stream.detail).toEqual({ history: 120, throughput: false });
    expect(t.controller.history.keep).toBe(120);
    expect(t.sockets[0].closed).toBe(true);
    t.controller.dispose();
  });

  it('stops everything when disposed', async () => {
    const t = setup();
    t.notebooks.show(notebook('k1'));
    await vi.advanceTimersByTimeAsync(0);
    t.sockets[0].open();
    t.controller.dispose();
    expect(t.sockets[0].closed).toBe(true);
    await vi.advanceTimersByTimeAsync(60000);
    expect(t.requests).toHaveLength(1);
  });
});

describe('"Release cache" and the cull warning', () => {
  function noticed(over: Partial<IControllerOptions> = {}) {
    const notices: INotice[] = [];
    const dismissed: string[] = [];
    const t = setup({
      notify: n => {
        notices.push(n);
        return `n${notices.length}`;
      },
      dismiss: id => dismissed.push(id),
      ...over
    });
    return { ...t, notices, dismissed };
  }

  it('confirms, calls the release route, then says what went back', async () => {
    const answer = {
      kernel_id: 'k-idle',
      status: 'ok',
      released: { torch: 60 * GIB },
      released_total: 60 * GIB,
      gc_collected: 12,
      no_gpu: null,
      round_trip_s: 0.2
    };
    const t = noticed({ kernelAction: async (id, api) => (api === 'release' ? answer : { status: 'ok' }) });
    t.confirm(false);
    expect(await t.controller.runAction({ kernelId: 'k-idle', action: 'release', label: 'train.ipynb' })).toBe(false);
    expect(t.notices).toEqual([]); // Cancel (or Escape) does nothing
    t.confirm(true);
    expect(await t.controller.runAction({ kernelId: 'k-idle', action: 'release', label: 'train.ipynb' })).toBe(true);
    expect(t.notices).toEqual([{ message: 'Released 60.0 GiB from train.ipynb', type: 'success', sticky: false }]);
    expect(t.errors).toEqual([]);
    t.controller.dispose();
  });

  it('routes "Release cache" to POST …/kernels/<id>/release', async () => {
    const t = noticed();
    await t.controller.runAction({ kernelId: 'k1', action: 'release', label: 'a.ipynb' });
    expect(t.actions).toEqual([['k1', 'release']]);
    t.controller.dispose();
  });

  it("shows a kernel's refusal in its words, and an HTTP refusal in the server's", async () => {
    const t = noticed({
      kernelAction: async () => ({ status: 'no-answer', reason: 'the kernel did not answer within 2 s: it may be busy' })
    });
    await t.controller.runAction({ kernelId: 'k1', action: 'release', label: 'a.ipynb' });
    expect(t.notices).toEqual([
      {
        message: 'Could not release the cached GPU memory of a.ipynb: the kernel did not answer within 2 s: it may be busy',
        type: 'error',
        sticky: false
      }
    ]);
    const u = noticed({
      kernelAction: async () => {
        throw httpError(409, 'an action on this kernel is in progress (restart): try again once it has finished');
      }
    });
    await u.controller.runAction({ kernelId: 'k1', action: 'release', label: 'a.ipynb' });
    expect(u.errors).toEqual([
      [
        'Could not release the cached GPU memory of a.ipynb',
        'an action on this kernel is in progress (restart): try again once it has finished'
      ]
    ]);
    expect(u.notices).toEqual([]);
    t.controller.dispose();
    u.controller.dispose();
  });

  it('words every answer of the release route', () => {
    expect(
      releaseNotice({ status: 'ok', no_gpu: 'no GPU framework is imported in this kernel', released_total: 0 }, 'a.ipynb')
        .message
    ).toBe('a.ipynb uses no GPU: nothing to release (no GPU framework is imported in this kernel).');
    expect(releaseNotice({ status: 'ok', released: {}, released_total: 0 }, 'a.ipynb').message).toBe(
      'a.ipynb held no cached GPU memory: nothing to release.'
    );
    expect(
      releaseNotice({ status: 'ok', released: { torch: GIB, cupy: 512 * 1024 ** 2 }, released_total: 1.5 * GIB }, 'a.ipynb')
        .message
    ).toBe('Released 1.50 GiB from a.ipynb (torch 1.00 GiB, cupy 512 MiB)');
    expect(releaseNotice({ status: 'dead', reason: "the kernel's process is not running" }, 'a.ipynb')).toMatchObject({
      type: 'error',
      message: "Could not release the cached GPU memory of a.ipynb: the kernel's process is not running"
    });
    expect(releaseNotice({ status: 'error' }, 'a.ipynb').message).toBe(
      'Could not release the cached GPU memory of a.ipynb: error'
    );
    expect(releaseNotice(null, 'a.ipynb').type).toBe('error');
  });

  it('warns once per kernel and cull time, not at every sample', () => {
    const t = noticed();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    t.sockets[0].send({ type: 'snapshot', ...holdersSnapshot(at(14, 0)) });
    expect(t.notices).toEqual([
      {
        message: 'Idle GPU notebook old.ipynb will be shut down at 14:10 to free 61.0 GiB; run a cell to keep it',
        type: 'warning',
        sticky: true,
        showPanel: true
      }
    ]);
    for (let i = 1; i <= 5; i++) {
      t.sockets[0].send({ type: 'snapshot', ...holdersSnapshot(at(14, 0, i)) });
    }
    expect(t.notices).toHaveLength(1);
    // the notebook ran a cell: the warning is taken back
    const used = holdersSnapshot(at(14, 1));
    const k = used.devices[0].processes!.find(p => p.kernel?.id === 'k-idle')!.kernel!;
    Object.assign(k, { cull_warning: false, cull_at: null, idle_holder: false, idle_s: 2 });
    t.sockets[0].send({ type: 'snapshot', ...used });
    expect(t.dismissed).toEqual(['n1']);
    // idle again, with a new cull time: one new warning
    const again = holdersSnapshot(at(16, 0));
    again.devices[0].processes!.find(p => p.kernel?.id === 'k-idle')!.kernel!.cull_at = at(16, 10);
    t.sockets[0].send({ type: 'snapshot', ...again });
    t.sockets[0].send({ type: 'snapshot', ...again, time: at(16, 0, 1) });
    expect(t.notices.map(n => n.message)).toEqual([
      'Idle GPU notebook old.ipynb will be shut down at 14:10 to free 61.0 GiB; run a cell to keep it',
      'Idle GPU notebook old.ipynb will be shut down at 16:10 to free 61.0 GiB; run a cell to keep it'
    ]);
    // a sample without it, then the same warning again: not shown twice
    t.sockets[0].send({ type: 'snapshot', ...twoGpus(at(16, 0, 2)) });
    expect(t.dismissed).toEqual(['n1', 'n2']);
    t.sockets[0].send({ type: 'snapshot', ...again, time: at(16, 0, 3) });
    expect(t.notices).toHaveLength(2);
    t.controller.dispose();
  });

  it('adds up what a kernel holds on every GPU, and says when the data is a replay', () => {
    const kernel = { id: 'k-12345678', name: 'python3', paths: [], cull_at: at(9, 5), cull_warning: true };
    expect(cullNotice(kernel, 2 * GIB, true).message).toBe(
      'Idle GPU notebook python3 kernel k-123456 will be shut down at 09:05 to free 2.00 GiB; run a cell to keep it' +
        ' (replay of a recorded trace, not live data)'
    );
    expect(cullNotice(kernel, null, false).message).toBe(
      'Idle GPU notebook python3 kernel k-123456 will be shut down at 09:05; run a cell to keep it'
    );
    const t = noticed();
    t.controller.setPanelVisible(true);
    t.sockets[0].open();
    const snap = holdersSnapshot();
    const second = { ...snap.devices[0], ordinal: 1, uuid: 'GPU-dddd', oom: null };
    second.processes = [{ pid: 5152, used_memory: 4 * GIB, kernel: { ...snap.devices[0].processes![2].kernel! } }];
    snap.devices.push(second);
    t.sockets[0].send({ type: 'snapshot', ...snap });
    expect(t.notices.map(n => n.message)).toEqual([
      'Idle GPU notebook old.ipynb will be shut down at 14:10 to free 65.0 GiB; run a cell to keep it'
    ]);
    t.controller.dispose();
  });
});

describe('suspendNotice', () => {
  it('says what moved and how long it took', () => {
    expect(suspendNotice('suspend', { moved_total: 10 * 1024 ** 3, seconds: 5.83 }, 'train.ipynb').message).toBe(
      'Suspended train.ipynb: 10.0 GiB of GPU memory moved to host memory in 5.8 s; its variables stay, and it ' +
        'resumes on its next cell.'
    );
    expect(suspendNotice('resume', { seconds: 1.85 }, 'train.ipynb').message).toBe(
      'Resumed train.ipynb in 1.9 s: its GPU memory is back.'
    );
  });
});
