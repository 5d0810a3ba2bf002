// @vitest-environment jsdom
/**
 * The kernel-view poll stands by while the browser tab is hidden (the Poll reads
 * `document.visibilityState`), and asks again once it is visible.
 */
import { Signal } from '@lumino/signaling';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { GpuController, INotebookRef, INotebookSource } from '../src/controller';
import { DeviceHistory } from '../src/history';
import { GpuStream, ISocket } from '../src/stream';

function setVisibility(state: 'visible' | 'hidden'): void {
  Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => state });
  document.dispatchEvent(new Event('visibilitychange'));
}

class Notebooks implements INotebookSource {
  readonly changed = new Signal<this, void>(this);
  nb: INotebookRef | null = { name: 'a.ipynb', path: 'a.ipynb', kernelId: 'k1', kernelName: 'Python 3', kernelStatus: 'idle' };
  current(): INotebookRef | null {
    return this.nb;
  }
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  setVisibility('visible');
  vi.useRealTimers();
});

describe('GpuController while the tab is hidden', () => {
  it('stands by, then asks again when the tab is shown', async () => {
    const socket = (): ISocket => ({ onopen: null, onmessage: null, onclose: null, onerror: null, close: () => undefined });
    const stream = new GpuStream({ url: () => 'ws://x', openSocket: socket, interval: 1 });
    let asked = 0;
    const controller = new GpuController({
      stream,
      history: new DeviceHistory(120, 1),
      notebooks: new Notebooks(),
      fetchKernelView: async () => {
        asked++;
        return { status: 'ok', device: null };
      },
      kernelAction: async () => ({}),
      confirm: async () => false,
      reportError: () => undefined
    });
    controller.setStatusVisible(true);
    await vi.advanceTimersByTimeAsync(0);
    expect(asked).toBe(1);
    setVisibility('hidden');
    await vi.advanceTimersByTimeAsync(5000); // one tick lingers
    const lingered = asked;
    await vi.advanceTimersByTimeAsync(60000);
    expect(asked).toBe(lingered);
    expect(lingered).toBeLessThanOrEqual(2);
    setVisibility('visible');
    await vi.advanceTimersByTimeAsync(5000);
    expect(asked).toBe(lingered + 1);
    controller.dispose();
  });
});
