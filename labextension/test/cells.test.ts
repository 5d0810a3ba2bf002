/**
 * TypedCells against a stand-in notebook (its cells, its kernel's id and status) and a recording
 * sender, on injected timers: a second after typing stops, only code cells, never while a cell
 * runs, nothing twice, nothing more to a kernel that refused, off with the setting.
 */
import { Signal } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { INotebookContext, ITypedNotebook, NotebookTyping, TYPING_PAUSE_MS, TypedCells } from '../src/cells';

class FakeTimers {
  now = 0;
  private _next = 1;
  private _due = new Map<number, { at: number; fn: () => void }>();

  set = (fn: () => void, ms: number): unknown => {
    const id = this._next++;
    this._due.set(id, { at: this.now + ms, fn });
    return id;
  };

  clear = (handle: unknown): void => {
    this._due.delete(handle as number);
  };

  /** Move the clock on by `ms`, running what falls due (in order). */
  advance(ms: number): void {
    const end = this.now + ms;
    for (;;) {
      const due = [...this._due.entries()].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
      if (!due) {
        break;
      }
      this._due.delete(due[0]);
      this.now = due[1].at;
      due[1].fn();
    }
    this.now = end;
  }

  get pending(): number {
    return this._due.size;
  }
}

class FakeNotebook implements ITypedNotebook {
  cells: { type: 'code' | 'markdown' | 'raw'; source: string }[] = [];
  kernel: string | null = 'k1';
  status: string | null = 'idle';
  contentChanged = new Signal<unknown, void>(this);
  kernelChanged = new Signal<unknown, void>(this);
  disposed = new Signal<unknown, void>(this);

  kernelId(): string | null {
    return this.kernel;
  }

  kernelStatus(): string | null {
    return this.status;
  }

  codeSources(): string[] {
    return this.cells.filter(c => c.type === 'code').map(c => c.source);
  }

  type(index: number, source: string, type: 'code' | 'markdown' | 'raw' = 'code'): void {
    this.cells[index] = { type, source };
    this.contentChanged.emit();
  }

  setStatus(status: string, kernel = this.kernel): void {
    this.status = status;
    this.kernel = kernel;
    this.kernelChanged.emit();
  }
}

type Answer = { status?: string } | Error;

function setup(answers: Answer[] = [], enabled = true) {
  const timers = new FakeTimers();
  const nb = new FakeNotebook();
  const sent: { kernel: string; cells: string[] }[] = [];
  const send = (kernel: string, cells: string[]) => {
    sent.push({ kernel, cells: [...cells] });
    const answer = answers.shift() ?? { status: 'ok' };
    return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
  };
  const typed = new TypedCells(nb, { send, enabled, setTimeout: timers.set, clearTimeout: timers.clear });
  return { timers, nb, sent, typed };
}

const settle = () => new Promise(resolve => setTimeout(resolve, 0));

/** Each text typed into the first cell, then a typing pause and its answer. */
async function typeEach(t: ReturnType<typeof setup>, texts: string[]): Promise<void> {
  for (const text of texts) {
    t.nb.type(0, text);
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
  }
}

function refusal(status: number): Error {
  return Object.assign(new Error(`refused (${status})`), { response: { status } });
}

describe('TypedCells', () => {
  it('sends the code cells a second after typing stops, not at every key', async () => {
    const t = setup();
    t.nb.type(0, 'import torch');
    t.timers.advance(TYPING_PAUSE_MS - 100);
    t.nb.type(0, 'import torch\nimport torch.nn as nn');
    t.timers.advance(TYPING_PAUSE_MS - 100);
    expect(t.sent).toEqual([]); // still typing
    t.timers.advance(100);
    await settle();
    expect(t.sent).toEqual([{ kernel: 'k1', cells: ['import torch\nimport torch.nn as nn'] }]);
  });

  it('sends only code cells, in order, and unsaved sources as they stand', async () => {
    const t = setup();
    t.nb.type(0, 'import torch');
    t.nb.type(1, '# Training', 'markdown');
    t.nb.type(2, 'raw text', 'raw');
    t.nb.type(3, 'opt = torch.optim.AdamW(model.parameters())');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.cells)).toEqual([['import torch', 'opt = torch.optim.AdamW(model.parameters())']]);
  });

  it('sends nothing while a cell runs, and sends once the kernel is idle and a second has passed', async () => {
    const t = setup();
    t.nb.setStatus('busy');
    t.nb.type(0, 'import torch');
    t.timers.advance(5 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toEqual([]);
    t.nb.setStatus('idle');
    t.timers.advance(TYPING_PAUSE_MS - 1);
    expect(t.sent).toEqual([]);
    t.timers.advance(1);
    await settle();
    expect(t.sent).toHaveLength(1);
  });

  it('a cell that starts within the second keeps the cells back until it ends', async () => {
    const t = setup();
    t.nb.type(0, 'x = 1');
    t.timers.advance(TYPING_PAUSE_MS / 2);
    t.nb.setStatus('busy');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toEqual([]);
    t.nb.setStatus('idle');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.cells)).toEqual([['x = 1']]);
  });

  it('sends the same cells once: outputs and executions change content, not sources', async () => {
    const t = setup();
    t.nb.type(0, 'import torch');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    t.nb.contentChanged.emit(); // an output arrived
    t.nb.setStatus('busy');
    t.nb.setStatus('idle');
    t.timers.advance(3 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(1);
    t.nb.type(1, 'x = torch.ones(3)');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.cells)).toEqual([['import torch'], ['import torch', 'x = torch.ones(3)']]);
  });

  it('stops for a kernel that refuses, and starts again when it restarts or changes', async () => {
    const t = setup([refusal(409)]);
    t.nb.type(0, 'import torch');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.typed.stopped).toBe(true);
    t.nb.type(0, 'import torch  # more');
    t.timers.advance(3 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(1);
    t.nb.setStatus('restarting');
    t.nb.setStatus('idle');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(2); // the unsaved edits again: the new process read only the file
    t.nb.setStatus('idle', 'k2');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.kernel)).toEqual(['k1', 'k1', 'k2']);
  });

  it('stops after a kernel gives no answer twice; a server that does not answer is tried again', async () => {
    const t = setup([{ status: 'no-answer' }, { status: 'no-answer' }]);
    await typeEach(t, ['a = 1', 'a = 2', 'a = 3']);
    expect(t.sent).toHaveLength(2);
    expect(t.typed.stopped).toBe(true);
    const u = setup([new TypeError('Failed to fetch')]);
    u.nb.type(0, 'a = 1');
    u.timers.advance(TYPING_PAUSE_MS);
    await settle();
    u.nb.type(0, 'a = 2');
    u.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(u.sent).toHaveLength(2);
    expect(u.typed.stopped).toBe(false);
  });

  it('a suspended kernel is sent the cells again once its next cell has resumed it, however often', async () => {
    const t = setup([{ status: 'suspended' }, { status: 'suspended' }, { status: 'suspended' }]);
    await typeEach(t, ['a = 1', 'a = 2', 'a = 3']);
    expect(t.sent).toHaveLength(3);
    expect(t.typed.stopped).toBe(false);
    t.nb.setStatus('busy'); // the cell that resumes it
    t.nb.setStatus('idle');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.cells)).toEqual([['a = 1'], ['a = 2'], ['a = 3'], ['a = 3']]);
  });

  it("an answer from before a restart does not count for the restarted kernel", async () => {
    let answer: (value: { status: string }) => void = () => undefined;
    const t = setup();
    const typed = new TypedCells(t.nb, {
      send: (kernel, cells) => {
        t.sent.push({ kernel, cells: [...cells] });
        return new Promise(resolve => (answer = resolve));
      },
      enabled: true,
      setTimeout: t.timers.set,
      clearTimeout: t.timers.clear
    });
    t.typed.dispose();
    t.nb.type(0, 'import torch');
    t.timers.advance(TYPING_PAUSE_MS);
    t.nb.setStatus('restarting');
    t.nb.setStatus('idle'); // the old process's answer is still on its way
    answer({ status: 'ok' });
    await settle();
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(2); // the restarted process is sent the unsaved cells too
    typed.dispose();
  });

  for (const how of ['restarted', 'changed'] as const) {
    it(`the kernel ${how} while cells are on their way, answered only later: the new one is sent them`, async () => {
      const answers: ((value: { status: string }) => void)[] = [];
      const t = setup();
      const typed = new TypedCells(t.nb, {
        send: (kernel, cells) => {
          t.sent.push({ kernel, cells: [...cells] });
          return new Promise(resolve => answers.push(resolve));
        },
        enabled: true,
        setTimeout: t.timers.set,
        clearTimeout: t.timers.clear
      });
      t.typed.dispose();
      t.nb.type(0, 'import torch');
      t.timers.advance(TYPING_PAUSE_MS); // on its way to k1
      if (how === 'restarted') {
        t.nb.setStatus('restarting');
        t.nb.setStatus('idle');
      } else {
        t.nb.setStatus('idle', 'k2');
      }
      t.timers.advance(TYPING_PAUSE_MS); // the new kernel's turn comes while the old one has not answered
      answers[0]({ status: 'no-answer' });
      await settle();
      t.timers.advance(TYPING_PAUSE_MS);
      await settle();
      expect(t.sent.map(s => s.kernel)).toEqual(how === 'restarted' ? ['k1', 'k1'] : ['k1', 'k2']);
      typed.dispose();
    });
  }

  it('sends nothing with the setting off, and what waits when it is turned on', async () => {
    const t = setup([], false);
    t.nb.type(0, 'import torch');
    t.timers.advance(3 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toEqual([]);
    expect(t.timers.pending).toBe(0);
    t.typed.enabled = true;
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(1);
    t.typed.enabled = false;
    t.nb.type(0, 'import torch, numpy');
    t.timers.advance(3 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(1);
  });

  it('without a kernel it waits for one; closing the notebook ends it', async () => {
    const t = setup();
    t.nb.kernel = null;
    t.nb.type(0, 'import torch');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toEqual([]);
    t.nb.setStatus('idle', 'k9');
    t.timers.advance(TYPING_PAUSE_MS);
    await settle();
    expect(t.sent.map(s => s.kernel)).toEqual(['k9']);
    t.nb.type(0, 'import torch, numpy');
    t.nb.disposed.emit();
    t.timers.advance(3 * TYPING_PAUSE_MS);
    await settle();
    expect(t.sent).toHaveLength(1);
    expect(t.typed.isDisposed).toBe(true);
    expect(t.timers.pending).toBe(0);
  });

  it('typing while the cells are on their way sends the newer ones after the answer', async () => {
    const timers = new FakeTimers();
    const nb = new FakeNotebook();
    const sent: string[][] = [];
    let answer: (value: { status: string }) => void = () => undefined;
    const send = (_kernel: string, cells: string[]) => {
      sent.push([...cells]);
      return new Promise<{ status: string }>(resolve => (answer = resolve));
    };
    new TypedCells(nb, { send, setTimeout: timers.set, clearTimeout: timers.clear });
    nb.type(0, 'a = 1');
    timers.advance(TYPING_PAUSE_MS);
    nb.type(0, 'a = 2');
    timers.advance(TYPING_PAUSE_MS);
    expect(sent).toEqual([['a = 1']]); // one at a time
    answer({ status: 'ok' });
    await settle();
    timers.advance(TYPING_PAUSE_MS);
    expect(sent).toEqual([['a = 1'], ['a = 2']]);
  });
});

/** A notebook document as JupyterLab's context holds it: every view of the document shares it. */
class FakeContext implements INotebookContext {
  ready = Promise.resolve();
  isDisposed = false;
  disposed = new Signal<unknown, void>(this);
  cells: { type: string; sharedModel: { getSource(): string } }[] = [];
  model = { contentChanged: new Signal<unknown, void>(this), cells: this.cells };
  sessionContext = {
    session: { kernel: { id: 'k1', status: 'idle' } },
    kernelChanged: new Signal<unknown, unknown>(this),
    statusChanged: new Signal<unknown, unknown>(this)
  };

  type(source: string): void {
    this.cells[0] = { type: 'code', sharedModel: { getSource: () => source } };
    this.model.contentChanged.emit();
  }

  dispose(): void {
    this.isDisposed = true;
    this.disposed.emit();
  }
}

describe('NotebookTyping', () => {
  function setupTyping() {
    const timers = new FakeTimers();
    const sent: { kernel: string; cells: string[] }[] = [];
    const typing = new NotebookTyping({
      send: async (kernel, cells) => {
        sent.push({ kernel, cells: [...cells] });
        return { status: 'ok' };
      },
      setTimeout: timers.set,
      clearTimeout: timers.clear
    });
    return { timers, sent, typing };
  }

  async function pause(timers: FakeTimers): Promise<void> {
    await settle(); // the context's `ready`
    timers.advance(TYPING_PAUSE_MS);
    await settle();
  }

  it('sends a notebook shown in two views once per edit, not once per view', async () => {
    const t = setupTyping();
    const doc = new FakeContext();
    t.typing.watch({ context: doc }); // the notebook's panel
    t.typing.watch({ context: doc }); // "New View for Notebook": another panel, the same document
    expect(t.typing.size).toBe(1);
    await settle();
    doc.type('import torch');
    await pause(t.timers);
    doc.type('import torch, numpy');
    await pause(t.timers);
    expect(t.sent).toEqual([
      { kernel: 'k1', cells: ['import torch'] },
      { kernel: 'k1', cells: ['import torch, numpy'] }
    ]);
    doc.dispose(); // every view closed
    expect(t.typing.size).toBe(0);
    doc.type('x = 1');
    await pause(t.timers);
    expect(t.sent).toHaveLength(2);
  });

  it('a second notebook on the same kernel still sends its own cells, once each', async () => {
    const t = setupTyping();
    const a = new FakeContext();
    const b = new FakeContext(); // "Change Kernel…" to a.ipynb's kernel
    t.typing.watch({ context: a });
    t.typing.watch({ context: b });
    await settle();
    a.type('import torch');
    await pause(t.timers);
    b.type('import jax');
    await pause(t.timers);
    expect(t.sent).toEqual([
      { kernel: 'k1', cells: ['import torch'] },
      { kernel: 'k1', cells: ['import jax'] }
    ]);
  });

  it('turns every notebook off and on with the setting', async () => {
    const t = setupTyping();
    const doc = new FakeContext();
    t.typing.watch({ context: doc });
    await settle();
    t.typing.enabled = false;
    doc.type('import torch');
    await pause(t.timers);
    expect(t.sent).toEqual([]);
    t.typing.enabled = true;
    await pause(t.timers);
    expect(t.sent).toHaveLength(1);
  });
});
