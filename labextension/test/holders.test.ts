// @vitest-environment jsdom
/**
 * Who holds a GPU: idle holders, their allocator figures, warm pool standbys, "Release cache"
 * on the rows where it helps, the out-of-memory banner and the cull warning's row mark — in the
 * view model and in the panel's DOM.
 */
import { Widget } from '@lumino/widgets';
import { describe, expect, it } from 'vitest';

import { IActionRequest } from '../src/controller';
import { DeviceHistory } from '../src/history';
import { allocatorText, cachedBytes, describeProcess, panelView, reclaimedLines } from '../src/model';
import { GpuPanel } from '../src/panel';
import { ISnapshot } from '../src/types';
import { at, GIB, holdersSnapshot, twoGpus } from './fixtures';

function mounted(): GpuPanel {
  const panel = new GpuPanel(new DeviceHistory(120, 1));
  Widget.attach(panel, document.body);
  return panel;
}

function rowOf(panel: GpuPanel, kernelOrPid: string): HTMLElement {
  const row =
    panel.node.querySelector(`.jp-gpuctx-process[data-kernel-id="${kernelOrPid}"]`) ??
    panel.node.querySelector(`.jp-gpuctx-process[data-pid="${kernelOrPid}"]`);
  expect(row).not.toBeNull();
  return row as HTMLElement;
}

/** The text a person sees: hidden elements left out. */
function visibleText(node: Element): string {
  const clone = node.cloneNode(true) as Element;
  clone.querySelectorAll('[hidden]').forEach(n => n.remove());
  return clone.textContent ?? '';
}

describe('idle holders in the view model', () => {
  it("names an idle holder's idle time and allocator figures, and offers to release its cache", () => {
    const idle = holdersSnapshot().devices[0].processes!.find(p => p.kernel?.id === 'k-idle')!;
    const view = describeProcess(idle);
    expect(view.label).toBe('old.ipynb');
    expect(view.idleText).toBe('idle 2 h 01 min');
    expect(view.allocatorText).toBe('60.0 GiB in tensors, 614 MiB cached');
    expect(view.idleHolder).toBe(true);
    expect(view.canRelease).toBe(true);
    expect(view.cullWarning).toBe(true);
    expect(view.cullText).toBe('shut down at 14:10 unless used');
    expect(view.description).toContain('idle holder');
    expect(view.description).toContain('idle 2 h 01 min');
  });

  it('derives the cache from reserved − allocated when the server leaves it out', () => {
    expect(cachedBytes({ id: 'k', memory: { allocated: GIB, reserved: 3 * GIB } })).toBe(2 * GIB);
    expect(cachedBytes({ id: 'k', memory: null })).toBeNull();
    expect(allocatorText({ id: 'k', memory: { allocated: GIB, reserved: GIB } })).toBe('1.00 GiB in tensors, 0 MiB cached');
    expect(allocatorText({ id: 'k' })).toBeNull();
    // no cache and not an idle holder: nothing to release
    const busy = describeProcess({
      pid: 1,
      used_memory: GIB,
      kernel: { id: 'k', execution_state: 'busy', idle_s: 500, memory: { allocated: GIB, reserved: GIB, cached: 0 } }
    });
    expect(busy.canRelease).toBe(false);
    expect(busy.idleText).toBeNull(); // a busy kernel is not idle, whatever its last activity
  });

  it('calls a pool standby a warm pool standby, without actions', () => {
    const standby = describeProcess({ pid: 900, used_memory: GIB, standby: { kernel_name: 'python3', age_s: 42 } });
    expect(standby.label).toBe('warm pool standby (python3)');
    expect(standby.standby).toBe(true);
    expect(standby.kernelId).toBeNull();
    expect(standby.description).toContain('started 42 s ago');
  });

  it("tells which notebook ran out of memory, and lists the GPU's holders largest first", () => {
    const d = panelView(holdersSnapshot()).devices[0];
    expect(d.oom).not.toBeNull();
    expect(d.oom!.kernelId).toBe('k-train');
    expect(d.oom!.text).toBe('train.ipynb ran out of memory here 13:58:07');
    expect(d.oom!.detail).toBe(
      'torch asked for 4.00 GiB more. Held here, largest first: python (PID 77) 70.0 GiB; ' +
        'old.ipynb 61.0 GiB (idle holder, idle 2 h 01 min); quiet.ipynb 3.00 GiB (idle 1 min); ' +
        'warm pool standby (python3) 512 MiB.'
    );
    expect(d.processes.map(p => [p.label, p.oom])).toEqual([
      ['python (PID 77)', 'holder'],
      ['old.ipynb', 'holder'],
      ['quiet.ipynb', 'holder'],
      ['train.ipynb', 'failing'],
      ['warm pool standby (python3)', 'holder']
    ]);
    expect(d.idleHeldText).toBe('61.0 GiB');
    // without an out-of-memory error: the server's order, nobody marked
    const calm = holdersSnapshot();
    calm.devices[0].oom = null;
    const view = panelView(calm).devices[0];
    expect(view.oom).toBeNull();
    expect(view.processes[0].label).toBe('train.ipynb');
    expect(view.processes.every(p => p.oom === null)).toBe(true);
  });

  it("words the server's last releases and culls, newest first, whatever fields they lack", () => {
    expect(panelView(holdersSnapshot(at(14, 0))).reclaimed).toEqual([
      '13:58:20 Released 1.00 GiB of cached memory from a.ipynb',
      '13:56:40 Shut down idle b.ipynb, freeing 3.00 GiB'
    ]);
    expect(
      reclaimedLines({ released: [{ kernel_id: 'abcdef1234' }, {} as never], culled: [{ paths: ['x/c.ipynb'], time: at(9, 0) }] })
    ).toEqual(['09:00:00 Shut down idle c.ipynb', 'Released cached memory from kernel abcdef12', 'Released cached memory from a notebook']);
    expect(reclaimedLines(null)).toEqual([]);
    expect(reclaimedLines({ released: 'nonsense' as never })).toEqual([]);
  });

  it('accepts the snapshot of a server without the new fields', () => {
    const old = twoGpus();
    delete old.holders;
    old.devices.forEach(d => {
      delete d.oom;
      delete d.idle_held;
    });
    const d = panelView(old).devices[0];
    expect(d.oom).toBeNull();
    expect(d.idleHeldText).toBeNull();
    expect(d.processes[0].idleHolder).toBe(false);
    expect(d.processes[0].canRelease).toBe(false);
    expect(panelView(old).reclaimed).toEqual([]);
  });
});

describe('idle holders in the panel', () => {
  it('marks an idle holder with a class and in words, with its idle time and allocator figures', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot());
    const row = rowOf(panel, 'k-idle');
    expect(row.classList.contains('jp-gpuctx-idle-holder')).toBe(true);
    expect(visibleText(row)).toContain('idle holder');
    expect(row.querySelector('.jp-gpuctx-process-idle')!.textContent).toBe('idle 2 h 01 min');
    expect(row.querySelector('.jp-gpuctx-process-allocator')!.textContent).toBe('60.0 GiB in tensors, 614 MiB cached');
    const quiet = rowOf(panel, 'k-quiet');
    expect(quiet.classList.contains('jp-gpuctx-idle-holder')).toBe(false);
    expect(visibleText(quiet)).not.toContain('idle holder');
    expect(visibleText(quiet)).toContain('idle 1 min');
    const standby = rowOf(panel, '900');
    expect(standby.classList.contains('jp-gpuctx-standby')).toBe(true);
    expect(standby.querySelector('.jp-gpuctx-process-label')!.textContent).toBe('warm pool standby (python3)');
    expect(standby.querySelectorAll('button')).toHaveLength(0);
    const card = panel.node.querySelector('.jp-gpuctx-card')!;
    expect(card.querySelector('.jp-gpuctx-idle-held')!.textContent).toBe('61.0 GiB');
    expect((card.querySelector('.jp-gpuctx-idle-held') as HTMLElement).hidden).toBe(false);
    Widget.detach(panel);
  });

  it('offers "Release cache" only on rows that hold cached memory or are idle holders', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot());
    const idle = rowOf(panel, 'k-idle');
    const button = idle.querySelector('button[data-action="release"]') as HTMLButtonElement;
    expect(button).not.toBeNull();
    expect(button.textContent).toBe('Release cache');
    expect(button.getAttribute('aria-label')).toBe('Release the cached GPU memory of old.ipynb');
    expect(Array.from(idle.querySelectorAll('button')).map(b => b.dataset.action)).toEqual([
      'interrupt',
      'release',
      'restart',
      'shutdown'
    ]);
    expect(rowOf(panel, 'k-train').querySelector('button[data-action="release"]')).not.toBeNull(); // 0.25 GiB cached
    expect(rowOf(panel, 'k-quiet').querySelector('button[data-action="release"]')).toBeNull(); // memory unknown
    const asked: IActionRequest[] = [];
    panel.actionRequested.connect((_, r) => asked.push(r));
    button.click();
    expect(asked).toEqual([{ kernelId: 'k-idle', action: 'release', label: 'old.ipynb' }]);
    // once the cache is gone and the kernel is used again, the button goes
    const after = holdersSnapshot();
    const k = after.devices[0].processes!.find(p => p.kernel?.id === 'k-idle')!.kernel!;
    Object.assign(k, { idle_holder: false, cull_warning: false, cull_at: null, idle_s: 3 });
    k.memory = { ...k.memory!, cached: 0, reserved: k.memory!.allocated };
    panel.setSnapshot(after);
    expect(rowOf(panel, 'k-idle').querySelector('button[data-action="release"]')).toBeNull();
    expect(rowOf(panel, 'k-idle').classList.contains('jp-gpuctx-idle-holder')).toBe(false);
    Widget.detach(panel);
  });

  it('offers "Release cache" in the notebook section when its kernel holds cached memory', () => {
    const panel = mounted();
    const info = { name: 'a.ipynb', path: 'x/a.ipynb', kernelId: 'k1', kernelName: 'Python 3', kernelStatus: 'idle' };
    const memory = [{ ordinal: 0, framework: 'torch', allocated: 0, reserved: 2 * GIB, peak: 2 * GIB }];
    panel.setNotebook(info, { status: 'ok', device: 0, memory });
    const section = panel.node.querySelector('.jp-gpuctx-notebook')!;
    const button = section.querySelector('button[data-action="release"]') as HTMLButtonElement;
    expect(button.getAttribute('aria-label')).toBe('Release the cached GPU memory of a.ipynb');
    const asked: IActionRequest[] = [];
    panel.actionRequested.connect((_, r) => asked.push(r));
    button.click();
    expect(asked).toEqual([{ kernelId: 'k1', action: 'release', label: 'a.ipynb' }]);
    Widget.detach(panel);
  });

  it('shows an out-of-memory banner and highlights the holders, largest first', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot());
    const card = panel.node.querySelector('.jp-gpuctx-card') as HTMLElement;
    expect(card.classList.contains('jp-gpuctx-mod-oom')).toBe(true);
    const banner = card.querySelector('.jp-gpuctx-oom') as HTMLElement;
    expect(banner.hidden).toBe(false);
    expect(banner.getAttribute('role')).toBe('status');
    expect(banner.dataset.kernelId).toBe('k-train');
    expect(banner.querySelector('.jp-gpuctx-oom-text')!.textContent).toBe('train.ipynb ran out of memory here 13:58:07');
    expect(banner.querySelector('.jp-gpuctx-oom-detail')!.textContent).toContain('Held here, largest first: python (PID 77)');
    // the banner comes before the meters
    expect(banner.compareDocumentPosition(card.querySelector('.jp-gpuctx-meter')!) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    const rows = Array.from(card.querySelectorAll('.jp-gpuctx-process')) as HTMLElement[];
    expect(rows.map(r => r.querySelector('.jp-gpuctx-process-memory')!.textContent)).toEqual([
      '70.0 GiB',
      '61.0 GiB',
      '3.00 GiB',
      '2.00 GiB',
      '512 MiB'
    ]);
    const failing = rowOf(panel, 'k-train');
    expect(failing.classList.contains('jp-gpuctx-oom-failing')).toBe(true);
    expect(failing.classList.contains('jp-gpuctx-oom-holder')).toBe(false);
    expect(visibleText(failing)).toContain('ran out of memory');
    expect(card.querySelectorAll('.jp-gpuctx-oom-holder')).toHaveLength(4);
    // once the server drops it (after 5 minutes), the banner and the marks go
    const later = holdersSnapshot();
    later.devices[0].oom = null;
    panel.setSnapshot(later);
    expect(banner.hidden).toBe(true);
    expect(card.classList.contains('jp-gpuctx-mod-oom')).toBe(false);
    expect(card.querySelectorAll('.jp-gpuctx-oom-holder, .jp-gpuctx-oom-failing')).toHaveLength(0);
    Widget.detach(panel);
  });

  it('marks the row of a kernel the server will cull, with the time in words', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot());
    const row = rowOf(panel, 'k-idle');
    expect(row.classList.contains('jp-gpuctx-cull-warning')).toBe(true);
    expect(row.querySelector('.jp-gpuctx-badge-cull')!.textContent).toBe('shut down at 14:10 unless used');
    expect(rowOf(panel, 'k-train').classList.contains('jp-gpuctx-cull-warning')).toBe(false);
    expect((rowOf(panel, 'k-train').querySelector('.jp-gpuctx-badge-cull') as HTMLElement).hidden).toBe(true);
    Widget.detach(panel);
  });

  it("names the top notebook's idle time and allocator figures in a compact row, and the out-of-memory error", () => {
    const panel = mounted();
    const snap: ISnapshot = holdersSnapshot();
    // train.ipynb is the top notebook only when it holds most; make old.ipynb the top one
    snap.devices[0].processes = snap.devices[0].processes!.filter(p => p.kernel?.id !== 'k-train');
    panel.setCompact(true);
    panel.setSnapshot(snap);
    const row = panel.node.querySelector('.jp-gpuctx-compact-row') as HTMLElement;
    const top = row.querySelector('.jp-gpuctx-compact-top') as HTMLElement;
    expect(top.textContent).toBe('old.ipynb · 61.0 GiB · idle holder · idle 2 h 01 min · 60.0 GiB in tensors, 614 MiB cached (+3)');
    expect(top.classList.contains('jp-gpuctx-idle-holder')).toBe(true);
    const oom = row.querySelector('.jp-gpuctx-compact-oom') as HTMLElement;
    expect(oom.hidden).toBe(false);
    expect(oom.getAttribute('role')).toBe('status');
    expect(oom.textContent).toBe('train.ipynb ran out of memory here 13:58:07');
    expect(row.classList.contains('jp-gpuctx-mod-oom')).toBe(true);
    Widget.detach(panel);
  });

  it('lists what the server reclaimed from idle notebooks, and hides the list when there is nothing', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot(at(14, 0)));
    const box = panel.node.querySelector('.jp-gpuctx-reclaimed') as HTMLElement;
    expect(box.hidden).toBe(false);
    expect(Array.from(box.querySelectorAll('li')).map(li => li.textContent)).toEqual([
      '13:58:20 Released 1.00 GiB of cached memory from a.ipynb',
      '13:56:40 Shut down idle b.ipynb, freeing 3.00 GiB'
    ]);
    panel.setSnapshot(twoGpus());
    expect(box.hidden).toBe(true);
    Widget.detach(panel);
  });

  it('updates idle times in place, so a focused button keeps focus', () => {
    const panel = mounted();
    panel.setSnapshot(holdersSnapshot());
    const button = rowOf(panel, 'k-idle').querySelector('button[data-action="release"]') as HTMLButtonElement;
    button.focus();
    const next = holdersSnapshot();
    next.devices[0].processes!.find(p => p.kernel?.id === 'k-idle')!.kernel!.idle_s = 7400;
    panel.setSnapshot(next);
    expect(document.activeElement).toBe(button);
    expect(rowOf(panel, 'k-idle').querySelector('.jp-gpuctx-process-idle')!.textContent).toBe('idle 2 h 03 min');
    Widget.detach(panel);
  });
});
