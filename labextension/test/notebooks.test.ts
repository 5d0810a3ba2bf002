/**
 * ActiveNotebook against stand-ins for JupyterLab's shell and notebook tracker: a notebook is
 * the active one only while its tab is the shell's current widget.
 */
import { Signal } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { ActiveNotebook } from '../src/notebooks';

/* eslint-disable @typescript-eslint/no-explicit-any */

function fakeNotebook(path: string, kernelId: string | null) {
  const owner = {};
  return {
    isDisposed: false,
    title: { label: path },
    context: { path, localPath: path, pathChanged: new Signal<any, string>(owner) },
    sessionContext: {
      session: kernelId ? { kernel: { id: kernelId } } : null,
      kernelDisplayName: 'Python 3',
      kernelDisplayStatus: 'idle',
      kernelChanged: new Signal<any, unknown>(owner),
      statusChanged: new Signal<any, unknown>(owner),
      ready: Promise.resolve()
    }
  };
}

function setup() {
  const owner = {};
  const tracker = {
    currentWidget: null as any,
    currentChanged: new Signal<any, any>(owner),
    widgetAdded: new Signal<any, any>(owner)
  };
  const shell = { currentWidget: null as any, currentChanged: new Signal<any, any>(owner) };
  const active = new ActiveNotebook(shell as any, tracker as any);
  let changes = 0;
  active.changed.connect(() => changes++);
  const focus = (widget: any, notebook = widget) => {
    shell.currentWidget = widget;
    if (notebook !== tracker.currentWidget) {
      tracker.currentWidget = notebook;
      tracker.currentChanged.emit(notebook);
    }
    shell.currentChanged.emit({ newValue: widget });
  };
  return { active, tracker, shell, focus, changes: () => changes };
}

describe('ActiveNotebook', () => {
  it("names the active tab's notebook and its kernel", () => {
    const t = setup();
    const nb = fakeNotebook('work/train.ipynb', 'k1');
    t.focus(nb);
    expect(t.active.current()).toEqual({
      name: 'train.ipynb',
      path: 'work/train.ipynb',
      kernelId: 'k1',
      kernelName: 'Python 3',
      kernelStatus: 'idle'
    });
    expect(t.changes()).toBeGreaterThan(0);
  });

  it('is null while another kind of tab is active, though the tracker still holds the notebook', () => {
    const t = setup();
    const nb = fakeNotebook('train.ipynb', 'k1');
    t.focus(nb);
    t.focus({ id: 'settings-editor' }, nb);
    expect(t.active.current()).toBeNull();
    t.focus(nb);
    expect(t.active.current()?.kernelId).toBe('k1');
  });

  it('follows the kernel of the active notebook', () => {
    const t = setup();
    const nb = fakeNotebook('train.ipynb', 'k1');
    t.focus(nb);
    const before = t.changes();
    nb.sessionContext.session = null; // shut down
    nb.sessionContext.kernelChanged.emit(null);
    expect(t.changes()).toBe(before + 1);
    expect(t.active.current()).toMatchObject({ kernelId: null, kernelName: null, kernelStatus: null });
  });
});
