// @vitest-environment jsdom
/**
 * The panel's DOM with GPUs (which CI machines do not have): cards, compact rows, processes
 * with their buttons, the replay banner, stale data, and that a card is updated in place rather
 * than rebuilt.
 */
import { Widget } from '@lumino/widgets';
import { describe, expect, it } from 'vitest';

import { IActionRequest, IHealth } from '../src/controller';
import { DeviceHistory } from '../src/history';
import { connectionView } from '../src/model';
import { GpuPanel, syncKeyed } from '../src/panel';
import { DEFAULT_SETTINGS } from '../src/settings';
import { ISnapshot } from '../src/types';
import { EMPTY_POOL, GIB, NO_GPU, readyPool, twoGpus } from './fixtures';

function mounted(): GpuPanel {
  const panel = new GpuPanel(new DeviceHistory(120, 1));
  Widget.attach(panel, document.body);
  return panel;
}

function manyGpus(n: number, time = 100): ISnapshot {
  const base = twoGpus(time).devices[0];
  return {
    gpu: true,
    reason: null,
    time,
    devices: Array.from({ length: n }, (_, i) => ({
      ...base,
      ordinal: i,
      nvml_index: i,
      uuid: `GPU-${i}000`,
      utilization: 10 * i,
      processes: i === 0 ? base.processes : []
    }))
  };
}

const LIVE = connectionView({ offline: false, staleFor: null, lastUpdate: null, hasData: true, replay: null });
const HEALTHY: IHealth = { connection: 'open', attempts: 0, stale: false, lastUpdate: null, outage: false, state: LIVE };

/** The text a person sees: hidden elements and tooltips left out. */
function visibleText(node: Element): string {
  const clone = node.cloneNode(true) as Element;
  clone.querySelectorAll('[hidden]').forEach(n => n.remove());
  return clone.textContent ?? '';
}

describe('GpuPanel', () => {
  it('renders one card per GPU with its meters, chart, processes and their kernel actions', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    const cards = panel.node.querySelectorAll('.jp-gpuctx-card');
    expect(cards).toHaveLength(2);
    const first = cards[0] as HTMLElement;
    expect(first.dataset.gpuctxDevice).toBe('GPU-aaaa');
    const heading = first.querySelector('h3')!;
    expect(heading.textContent).toBe('cuda:0 · NVIDIA H200');
    expect(first.getAttribute('aria-labelledby')).toBe(heading.id);
    expect(first.querySelector('.jp-gpuctx-meter-utilization .jp-gpuctx-meter-value')!.textContent).toBe('37%');
    expect(first.querySelector('[data-gpuctx-meter="memory"] .jp-gpuctx-meter-value')!.textContent).toBe(
      '12.1 GiB / 140 GiB'
    );
    const meters = first.querySelectorAll('[role="meter"]');
    expect(meters[0].getAttribute('aria-valuenow')).toBe('37');
    expect(meters[1].getAttribute('aria-valuetext')).toBe('12.1 GiB / 140 GiB');
    // the bar sits on its own line under the label and value, in both meters alike
    for (const meter of Array.from(first.querySelectorAll('.jp-gpuctx-meter'))) {
      expect(Array.from(meter.children).map(c => c.className)).toEqual(['jp-gpuctx-meter-head', 'jp-gpuctx-meter-bar']);
    }
    const chart = first.querySelector('.jp-gpuctx-chart') as HTMLElement;
    expect(chart.querySelector('[role="img"]')!.getAttribute('aria-label')).toContain('over the last 2 min');
    expect(chart.querySelector('.jp-gpuctx-legend')!.textContent).toContain('Utilisation');
    const labels = Array.from(first.querySelectorAll('.jp-gpuctx-process-label')).map(n => n.textContent);
    expect(labels).toEqual(['train.ipynb', 'python (PID 77)']);
    const buttons = Array.from(first.querySelectorAll('.jp-gpuctx-actions button')) as HTMLButtonElement[];
    expect(buttons.map(b => b.getAttribute('aria-label'))).toEqual([
      'Interrupt the kernel of train.ipynb',
      'Restart the kernel of train.ipynb',
      'Shut down the kernel of train.ipynb'
    ]);
    const asked: IActionRequest[] = [];
    panel.actionRequested.connect((_, r) => asked.push(r));
    buttons[1].click();
    expect(asked).toEqual([{ kernelId: 'k-123456789', action: 'restart', label: 'train.ipynb' }]);
    expect((panel.node.querySelector('.jp-gpuctx-nogpu') as HTMLElement).hidden).toBe(true);
    Widget.detach(panel);
  });

  it('keeps UUIDs in tooltips, out of the visible text', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    const card = panel.node.querySelector('.jp-gpuctx-card') as HTMLElement;
    expect(visibleText(card)).not.toContain('GPU-aaaa');
    expect(card.querySelector('.jp-gpuctx-card-subtitle')!.textContent).toBe('nvidia-smi 1');
    expect((card.querySelector('.jp-gpuctx-card-title') as HTMLElement).title).toContain('UUID GPU-aaaa');
    Widget.detach(panel);
  });

  it('updates cards in place, so a focused button keeps focus', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus(100));
    const button = panel.node.querySelector('.jp-gpuctx-card button') as HTMLButtonElement;
    const chart = panel.node.querySelector('.jp-gpuctx-chart');
    button.focus();
    const next = twoGpus(101);
    next.devices[0].utilization = 80;
    next.devices[0].processes![0].used_memory = 2 * GIB;
    panel.setSnapshot(next);
    expect(document.activeElement).toBe(button);
    const card = panel.node.querySelector('.jp-gpuctx-card')!;
    expect(card.querySelector('.jp-gpuctx-chart')).toBe(chart);
    expect(card.querySelector('.jp-gpuctx-meter-value')!.textContent).toBe('80%');
    expect(card.querySelector('.jp-gpuctx-process-memory')!.textContent).toBe('2.00 GiB');
    Widget.detach(panel);
  });

  it('warns on a memory meter above the threshold', () => {
    const panel = mounted();
    const snap = twoGpus();
    snap.devices[0].memory_used = 0.95 * snap.devices[0].memory_total!;
    panel.setSnapshot(snap);
    const [first, second] = Array.from(panel.node.querySelectorAll('.jp-gpuctx-meter-memory')) as HTMLElement[];
    expect(first.classList.contains('jp-gpuctx-mod-warn')).toBe(true);
    expect(first.title).toContain('above the 90% warning threshold');
    expect(first.querySelector('[role="meter"]')!.getAttribute('aria-valuetext')).toContain('above the 90% warning threshold');
    expect(second.classList.contains('jp-gpuctx-mod-warn')).toBe(false);
    panel.configure({ ...DEFAULT_SETTINGS, memoryWarningPercent: 99 });
    expect(first.classList.contains('jp-gpuctx-mod-warn')).toBe(false);
    Widget.detach(panel);
  });

  it('puts "No GPU" and its reason first, and drops the cards', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    panel.setSnapshot({ ...NO_GPU, time: 200 });
    expect(panel.node.querySelectorAll('.jp-gpuctx-card')).toHaveLength(0);
    const note = panel.node.querySelector('.jp-gpuctx-nogpu') as HTMLElement;
    expect(note.hidden).toBe(false);
    expect(note.textContent).toBe('No GPU: NVML reports: libnvidia-ml.so.1 not found');
    expect(note.getAttribute('role')).toBe('status');
    const notebook = panel.node.querySelector('.jp-gpuctx-notebook')!;
    expect(note.compareDocumentPosition(notebook) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    expect((panel.node.querySelector('.jp-gpuctx-compact-toggle') as HTMLElement).hidden).toBe(true);
    Widget.detach(panel);
  });

  it('says the state of the data once, in its header: replay with the file, its full path in the tooltip', () => {
    const panel = mounted();
    const replay = { source: '/work/main/tests/data/h200-trace.jsonl', recorded: '2026-11-29T18:53:45+0000' };
    panel.setSnapshot({ ...twoGpus(100), replay });
    const state = connectionView({
      offline: false,
      staleFor: null,
      lastUpdate: null,
      hasData: true,
      replay: { source: replay.source, name: 'h200-trace.jsonl', recorded: replay.recorded }
    });
    panel.setHealth({ ...HEALTHY, state });
    const line = panel.node.querySelector('.jp-gpuctx-header .jp-gpuctx-state') as HTMLElement;
    expect(panel.node.querySelectorAll('.jp-gpuctx-state')).toHaveLength(1);
    expect(line.dataset.state).toBe('replay');
    expect(line.classList.contains('jp-gpuctx-replay')).toBe(true);
    expect(visibleText(line)).toContain('Replay of a recorded trace — not live data');
    const detail = line.querySelector('.jp-gpuctx-state-detail') as HTMLElement;
    expect(detail.textContent).toBe('h200-trace.jsonl, recorded 2026-11-29T18:53:45+0000');
    expect(detail.title).toBe('/work/main/tests/data/h200-trace.jsonl');
    expect(line.querySelector('[role="status"]')!.textContent).toBe(
      'Replay of a recorded trace — not live data. h200-trace.jsonl, recorded 2026-11-29T18:53:45+0000'
    );
    expect(panel.hasClass('jp-gpuctx-mod-replay')).toBe(true);
    panel.setSnapshot(twoGpus(300));
    panel.setHealth(HEALTHY);
    expect(line.dataset.state).toBe('live');
    expect(detail.hidden).toBe(true);
    expect(panel.hasClass('jp-gpuctx-mod-replay')).toBe(false);
    Widget.detach(panel);
  });

  it('dims stale data, says for how long, and offers no action while the server does not answer', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    panel.setHealth(HEALTHY);
    const info = { name: 'a.ipynb', path: 'x/a.ipynb', kernelId: 'k1', kernelName: 'Python 3', kernelStatus: 'idle' };
    panel.setNotebook(info, { status: 'ok', device: null, memory: [] });
    const buttons = () => panel.node.querySelectorAll('.jp-gpuctx-notebook button, .jp-gpuctx-card button').length;
    expect(buttons()).toBeGreaterThan(0);
    expect(panel.hasClass('jp-gpuctx-stale')).toBe(false);
    const at = new Date(2025, 0, 1, 14, 3, 21).getTime();
    const stale = connectionView({ offline: false, staleFor: 12, lastUpdate: at, hasData: true, replay: null });
    panel.setHealth({ connection: 'open', attempts: 0, stale: true, lastUpdate: at, outage: true, state: stale });
    expect(panel.hasClass('jp-gpuctx-stale')).toBe(true);
    const line = panel.node.querySelector('.jp-gpuctx-state') as HTMLElement;
    expect(visibleText(line)).toContain('Stale for 12 s: no data from the server since 14:03:21');
    const spoken = line.querySelector('[role="status"]') as HTMLElement;
    expect(spoken.textContent).toBe('Stale: no data from the server since 14:03:21');
    expect(panel.node.querySelector('.jp-gpuctx-devices')!.getAttribute('aria-describedby')).toBe(spoken.id);
    expect(buttons()).toBe(0);
    const offline = connectionView({ offline: true, staleFor: 40, lastUpdate: at, hasData: true, replay: null });
    panel.setHealth({ connection: 'waiting', attempts: 3, stale: true, lastUpdate: at, outage: true, state: offline });
    expect(line.dataset.state).toBe('offline');
    expect(visibleText(line)).toContain('Offline: lost contact with the Jupyter server; retrying… Last update 14:03:21.');
    expect(panel.node.querySelectorAll('.jp-gpuctx-outage, .jp-gpuctx-freshness')).toHaveLength(0); // one state only
    panel.setHealth(HEALTHY);
    expect(panel.hasClass('jp-gpuctx-stale')).toBe(false);
    expect(line.dataset.state).toBe('live');
    expect(buttons()).toBeGreaterThan(0);
    Widget.detach(panel);
  });

  it('shows one compact row per GPU above the threshold, switchable from the header', () => {
    const panel = mounted();
    panel.setSnapshot(manyGpus(4));
    expect(panel.compact).toBe(false);
    expect(panel.node.dataset.gpuctxCompact).toBeUndefined();
    panel.setSnapshot(manyGpus(5, 101));
    expect(panel.compact).toBe(true);
    expect(panel.node.hasAttribute('data-gpuctx-compact')).toBe(true);
    expect(panel.node.querySelectorAll('.jp-gpuctx-card')).toHaveLength(0);
    const rows = Array.from(panel.node.querySelectorAll('.jp-gpuctx-compact-row')) as HTMLElement[];
    expect(rows).toHaveLength(5);
    const row = rows[0];
    expect(row.dataset.gpuctxDevice).toBe('GPU-0000');
    expect(row.querySelector('.jp-gpuctx-compact-name')!.textContent).toBe('cuda:0');
    expect(row.querySelector('.jp-gpuctx-compact-model')!.textContent).toBe('H200');
    expect(row.querySelector('.jp-gpuctx-compact-facts')!.textContent).toBe('29 °C');
    expect(row.querySelectorAll('.jp-gpuctx-meter-bar')).toHaveLength(2);
    // labelled, with used / total
    expect(visibleText(row.querySelector('.jp-gpuctx-meter-utilization')!)).toBe('Util0%');
    expect(visibleText(row.querySelector('.jp-gpuctx-meter-memory')!)).toBe('Mem12.1 / 140 GiB');
    expect(row.querySelector('.jp-gpuctx-compact-top')!.textContent).toBe('train.ipynb · 630 MiB (+1)');
    expect(rows[1].querySelector('.jp-gpuctx-compact-top')!.textContent).toBe('no processes');
    expect(visibleText(row)).not.toContain('GPU-0000');
    expect(row.title).toContain('UUID GPU-0000');
    // the toggle: cards again, and the choice sticks
    const toggle = panel.node.querySelector('.jp-gpuctx-compact-toggle') as HTMLButtonElement;
    expect(toggle.hidden).toBe(false);
    expect(toggle.getAttribute('aria-pressed')).toBe('true');
    toggle.click();
    expect(panel.compact).toBe(false);
    expect(toggle.getAttribute('aria-pressed')).toBe('false');
    expect(panel.node.querySelectorAll('.jp-gpuctx-card')).toHaveLength(5);
    expect(panel.node.querySelectorAll('.jp-gpuctx-compact-row')).toHaveLength(0);
    panel.setSnapshot(manyGpus(5, 102));
    expect(panel.compact).toBe(false);
    toggle.click();
    expect(panel.compact).toBe(true);
    // the threshold is a setting
    panel.setCompact(null);
    panel.configure({ ...DEFAULT_SETTINGS, compactAbove: 8 });
    expect(panel.compact).toBe(false);
    Widget.detach(panel);
  });

  it('shows the warm reserve under the GPUs, updates it in place, and drops it when the pool goes', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus(100));
    const section = panel.node.querySelector('.jp-gpuctx-reserve') as HTMLElement;
    expect(section.hidden).toBe(true);
    panel.setSnapshot({ ...twoGpus(101), pool: readyPool() });
    expect(section.hidden).toBe(false);
    const heading = section.querySelector('h3')!;
    expect(section.getAttribute('aria-labelledby')).toBe(heading.id);
    expect(heading.textContent).toBe('Warm reserve: 1 kernel ready');
    const lines = () => Array.from(section.querySelectorAll('li')).map(li => li.textContent);
    expect(lines()).toEqual([
      'python3 · GPU-ready · GPU 0 · 630 MiB · warmed for train.ipynb · RSS 1.76 GiB · ready',
      'Restart of this notebook is GPU-ready: train.ipynb',
      "Standbys' host memory: 1.76 / 4.80 GiB budget (machine)"
    ]);
    const cards = panel.node.querySelectorAll('.jp-gpuctx-card');
    expect(cards[cards.length - 1].compareDocumentPosition(section) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    // the same pool on the next tick: the same nodes
    const item = section.querySelector('li');
    panel.setSnapshot({ ...twoGpus(102), pool: readyPool() });
    expect(section.querySelector('li')).toBe(item);
    panel.setSnapshot({ ...twoGpus(103), pool: EMPTY_POOL });
    expect(heading.textContent).toBe('Warm reserve: empty');
    expect(lines()).toEqual(['no GPU notebook is running: the reserve starts once one runs']);
    expect(section.classList.contains('jp-gpuctx-mod-warn')).toBe(false);
    panel.setSnapshot({ ...twoGpus(104), pool: { error: 'pool stopped' } });
    expect(heading.textContent).toBe('Warm reserve: status unavailable (pool stopped)');
    expect(section.classList.contains('jp-gpuctx-mod-warn')).toBe(true);
    expect((section.querySelector('ul') as HTMLElement).hidden).toBe(true);
    panel.setSnapshot({ ...twoGpus(105), pool: null });
    expect(section.hidden).toBe(true);
    expect(visibleText(panel.node)).not.toContain('Warm reserve');
    Widget.detach(panel);
  });

  it("shows each kernel's host memory and CPU beside its GPU memory", () => {
    const panel = mounted();
    const snap = twoGpus();
    snap.host = { cpu_percent: 12, memory_used: 8 * GIB, memory_total: 64 * GIB, time: 100, kernels: {
      'k-123456789': { memory: 2.5 * GIB, cpu_percent: 99.6, processes: 2 }
    } };
    panel.setSnapshot(snap);
    const row = panel.node.querySelector('.jp-gpuctx-process[data-kernel-id="k-123456789"]') as HTMLElement;
    expect(row.querySelector('.jp-gpuctx-process-host')!.textContent).toBe('host 2.50 GiB memory, 100% CPU (2 processes)');
    const info = { name: 'train.ipynb', path: 'work/train.ipynb', kernelId: 'k-123456789', kernelName: 'Python 3', kernelStatus: 'busy' };
    panel.setNotebook(info, { status: 'ok', device: 0, memory: [] });
    expect(panel.node.querySelector('.jp-gpuctx-notebook dl')!.textContent).toContain('Host2.50 GiB memory, 100% CPU (2 processes)');
    Widget.detach(panel);
  });

  it("shows the active notebook's kernel with its actions, and the warm-up reason folded away", () => {
    const panel = mounted();
    const detail = 'imported torch only; no GPU is visible: NVML reports: libnvidia-ml.so.1 not found';
    const info = { name: 'a.ipynb', path: 'x/a.ipynb', kernelId: 'k1', kernelName: 'Python 3', kernelStatus: 'busy' };
    panel.setNotebook(info, { status: 'ok', device: null, memory: [], warmup: { state: 'skipped', detail } });
    const section = panel.node.querySelector('.jp-gpuctx-notebook')!;
    expect(section.querySelector('.jp-gpuctx-notebook-name')!.textContent).toBe('a.ipynb (Python 3, busy)');
    const details = section.querySelector('details') as HTMLDetailsElement;
    expect(details.open).toBe(false);
    expect(details.querySelector('summary')!.textContent).toBe('skipped');
    expect(details.textContent).toContain(detail);
    details.open = true;
    // the next answer, with the same rows, leaves it as the user put it
    panel.setNotebook(info, { status: 'ok', device: null, memory: [], warmup: { state: 'skipped', detail } });
    expect((section.querySelector('details') as HTMLDetailsElement).open).toBe(true);
    panel.setNotebook(info, { status: 'ok', device: null, memory: [], pooled: true, warmup: { state: 'skipped', detail } });
    expect((section.querySelector('details') as HTMLDetailsElement).open).toBe(true);
    expect(section.querySelector('dl')!.textContent).toContain('from the warm pool');
    // it holds no GPU memory: nothing to release
    expect(Array.from(section.querySelectorAll('button')).map(b => b.textContent)).toEqual([
      'Interrupt',
      'Restart',
      'Shut down'
    ]);
    const cached = { ordinal: 0, framework: 'torch', allocated: GIB, reserved: 3 * GIB, peak: 3 * GIB };
    panel.setNotebook(info, { status: 'ok', device: 0, memory: [cached], warmup: { state: 'done' } });
    expect(Array.from(section.querySelectorAll('button')).map(b => b.textContent)).toEqual([
      'Interrupt',
      'Release cache',
      'Restart',
      'Shut down'
    ]);
    // shut down elsewhere: no buttons for a kernel that is no longer running
    panel.setNotebook(info, { status: 'gone', reason: 'the kernel is no longer running' });
    expect(section.querySelectorAll('button')).toHaveLength(0);
    expect(section.textContent).toContain('the kernel is no longer running');
    panel.setNotebook(null, null);
    expect(section.querySelectorAll('button')).toHaveLength(0);
    Widget.detach(panel);
  });

  it('offers Suspend on idle kernels, lists suspended notebooks with Resume, and follows the server in the notebook section', () => {
    const panel = mounted();
    const snap = twoGpus();
    snap.suspend = { available: true, reason: 'driver 580' };
    snap.devices[0].processes![0].kernel!.execution_state = 'idle';
    snap.devices[0].suspended = [{ kernel: { id: 'k-away', name: 'python3', paths: ['away.ipynb'] }, bytes: 60 * GIB,
                                   since: 1_764_470_000 }];
    snap.suspended = [{ kernel_id: 'k-away', paths: ['away.ipynb'], since: 1_764_470_000, moved: { '0': 60 * GIB },
                        moved_total: 60 * GIB }];
    panel.setSnapshot(snap);
    const card = panel.node.querySelector('.jp-gpuctx-card') as HTMLElement;
    const rowButtons = Array.from(card.querySelectorAll('.jp-gpuctx-processes .jp-gpuctx-actions button'));
    expect(rowButtons.map(b => b.textContent)).toEqual(['Interrupt', 'Suspend', 'Restart', 'Shut down']);
    const away = card.querySelector('.jp-gpuctx-suspended-item') as HTMLElement;
    expect(visibleText(card)).toContain('Suspended (in host memory)');
    expect(away.querySelector('.jp-gpuctx-badge-suspended')!.textContent).toMatch(
      /^suspended: 60\.0 GiB in host memory since \d\d:\d\d$/
    );
    const buttons = Array.from(away.querySelectorAll('button')) as HTMLButtonElement[];
    expect(buttons.map(b => b.textContent)).toEqual(['Interrupt', 'Resume', 'Restart', 'Shut down']);
    const asked: IActionRequest[] = [];
    panel.actionRequested.connect((_, r) => asked.push(r));
    buttons[1].click();
    expect(asked).toEqual([{ kernelId: 'k-away', action: 'resume', label: 'away.ipynb' }]);
    // the notebook section: the active notebook's kernel is idle on a GPU, so Suspend applies (no
    // Release: it holds nothing cached)
    const section = panel.node.querySelector('.jp-gpuctx-notebook')!;
    const info = { name: 'train.ipynb', path: 'work/train.ipynb', kernelId: 'k-123456789', kernelName: 'Python 3',
                   kernelStatus: 'idle' };
    panel.setNotebook(info, { status: 'ok', device: 0, memory: [], warmup: { state: 'done' } });
    const names = () => Array.from(section.querySelectorAll('button')).map(b => b.textContent);
    expect(names()).toEqual(['Interrupt', 'Suspend', 'Restart', 'Shut down']);
    // suspended now: the server lists it, its process is gone from the GPU
    snap.devices[0].processes = snap.devices[0].processes!.slice(1);
    snap.suspended.push({ kernel_id: 'k-123456789', paths: ['work/train.ipynb'], moved: { '0': GIB }, moved_total: GIB });
    panel.setSnapshot(snap);
    expect(names()).toEqual(['Interrupt', 'Resume', 'Restart', 'Shut down']);
    // a server without the API: no Suspend anywhere
    snap.suspended = [];
    snap.devices[0].suspended = [];
    snap.suspend = { available: false, reason: 'no driver' };
    snap.devices[0].processes = twoGpus().devices[0].processes;
    snap.devices[0].processes![0].kernel!.execution_state = 'idle';
    panel.setSnapshot(snap);
    expect(names()).toEqual(['Interrupt', 'Restart', 'Shut down']);
    expect(visibleText(panel.node)).not.toContain('Suspend');
    Widget.detach(panel);
  });
});

describe('syncKeyed', () => {
  it('keeps one node per key, in order, made once, updated in place and removed with its key', () => {
    const container = document.createElement('ul');
    const nodes = new Map<string, { root: HTMLElement; updates: number }>();
    const made: string[] = [];
    const sync = (keys: string[]) =>
      syncKeyed(
        container,
        nodes,
        keys.map(key => ({ key })),
        key => {
          made.push(key);
          const root = document.createElement('li');
          root.textContent = key;
          return { root, updates: 0 };
        },
        node => node.updates++
      );
    sync(['a', 'b', 'c']);
    const b = nodes.get('b')!.root;
    sync(['c', 'b']);
    expect(Array.from(container.children).map(c => c.textContent)).toEqual(['c', 'b']);
    expect(nodes.get('b')!.root).toBe(b);
    expect(nodes.get('b')!.updates).toBe(2);
    expect(made).toEqual(['a', 'b', 'c']);
    expect(nodes.has('a')).toBe(false);
  });
});
