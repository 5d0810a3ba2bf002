import { describe, expect, it } from 'vitest';

import {
  connectionView,
  describeProcess,
  hostUsageText,
  INotebookActionsInput,
  IStatusInput,
  kernelGpu,
  kernelRows,
  notebookActions,
  OUTAGE_TEXT,
  panelView,
  REPLAY_BANNER,
  reserveView,
  reclaimedLines,
  statusView,
  suspendedText,
  warmupSummary
} from '../src/model';
import { formatClock, MIB } from '../src/format';
import { IKernelView, ISnapshot } from '../src/types';
import { EMPTY_POOL, GIB, NO_GPU, readyPool, twoGpus } from './fixtures';

describe('panelView', () => {
  it('carries the server reason when there is no GPU', () => {
    const view = panelView(NO_GPU);
    expect(view.noGpu).toBe('NVML reports: libnvidia-ml.so.1 not found');
    expect(view.devices).toEqual([]);
    expect(view.replay).toBeNull();
  });

  it('titles cards by CUDA ordinal; the UUID goes to the tooltip, not the visible text', () => {
    const view = panelView(twoGpus());
    expect(view.noGpu).toBeNull();
    expect(view.devices.map(d => d.title)).toEqual(['cuda:0 · NVIDIA H200', 'cuda:1 · NVIDIA H200']);
    const d = view.devices[0];
    expect(d.key).toBe('GPU-aaaa');
    expect(d.subtitle).toBe('nvidia-smi 1');
    expect(d.tooltip).toContain('UUID GPU-aaaa');
    expect(d.shortName).toBe('cuda:0');
    expect(d.utilizationText).toBe('37%');
    expect(d.memoryText).toBe('12.1 GiB / 140 GiB');
    expect(d.memoryUsedText).toBe('12.1 GiB');
    expect(d.powerText).toBe('120 / 700 W');
    expect(d.temperatureText).toBe('29 °C');
  });

  it('warns at the memory threshold', () => {
    const snap = twoGpus();
    snap.devices[0].memory_used = 0.95 * snap.devices[0].memory_total!;
    expect(panelView(snap).devices[0].memoryWarn).toBe(true);
    expect(panelView(snap, 0.99).devices[0].memoryWarn).toBe(false);
    expect(panelView(snap).devices[1].memoryWarn).toBe(false);
  });

  it('names processes by notebook, kernel, process name or PID, and picks the top one', () => {
    const [nb, other] = panelView(twoGpus()).devices[0].processes;
    expect(nb.label).toBe('train.ipynb');
    expect(nb.kernelId).toBe('k-123456789');
    expect(nb.executionState).toBe('busy');
    expect(nb.description).toContain('work/train.ipynb');
    expect(other.label).toBe('python (PID 77)');
    expect(other.kernelId).toBeNull();
    // the notebook, though the other process holds more memory
    expect(panelView(twoGpus()).devices[0].top?.label).toBe('train.ipynb');
    const bare = panelView(twoGpus()).devices[1].processes[0];
    expect(bare.label).toBe('python3 kernel k-other');
    expect(describeProcess({ pid: 9 }).label).toBe('PID 9');
  });

  it('names the GPUs that CUDA_VISIBLE_DEVICES hides', () => {
    const snap = { ...twoGpus(), hidden: [{ nvml_index: 2, uuid: 'GPU-c', name: 'NVIDIA H200' }] };
    expect(panelView(snap).notes).toEqual([
      "Not visible to this server's kernels (CUDA_VISIBLE_DEVICES): nvidia-smi 2 NVIDIA H200"
    ]);
  });

  it('gives the replayed trace by file name, with the full path for the tooltip', () => {
    const replay = panelView({ ...NO_GPU, replay: { source: '/data/traces/h200.jsonl', recorded: '2025-01-01' } });
    expect(replay.replay).toEqual({ source: '/data/traces/h200.jsonl', name: 'h200.jsonl', recorded: '2025-01-01' });
  });
});

describe('the GPU a notebook uses', () => {
  const snap = twoGpus();

  it('is the device the kernel reports first', () => {
    const used = kernelGpu(snap, 'k-other', { status: 'ok', device: 0, device_source: 'the server (least-used)' });
    expect(used?.device.ordinal).toBe(0);
    expect(used?.why).toBe('chosen by the server (least-used)');
  });

  it('else the GPU its process holds memory on', () => {
    expect(kernelGpu(snap, 'k-other', null)?.device.ordinal).toBe(1);
    expect(kernelGpu(snap, 'k-other', { status: 'no-answer' })?.device.ordinal).toBe(1);
  });

  it("else where its allocator holds memory, else CUDA's default once CUDA started", () => {
    const memory: IKernelView = {
      status: 'ok',
      device: null,
      memory: [{ ordinal: 1, allocated: GIB, reserved: GIB, peak: GIB }]
    };
    expect(kernelGpu(snap, 'k-new', memory)?.device.ordinal).toBe(1);
    const started = kernelGpu(snap, 'k-new', { status: 'ok', device: null, cuda_started: ['torch'] });
    expect(started?.device.ordinal).toBe(0);
    expect(started?.why).toContain('torch started CUDA');
  });

  it('is none for a kernel that shows no use of a GPU, or without a GPU or a kernel', () => {
    expect(kernelGpu(snap, 'k-new', { status: 'ok', device: null, cuda_started: [], memory: [] })).toBeNull();
    expect(kernelGpu(snap, 'k-new', null)).toBeNull();
    expect(kernelGpu(NO_GPU, 'k-123456789', { status: 'ok', device: 0 })).toBeNull();
    expect(kernelGpu(snap, null, null)).toBeNull();
  });
});

describe('statusView', () => {
  const live = connectionView({ offline: false, staleFor: null, lastUpdate: null, hasData: true, replay: null });
  const input = (over: Partial<IStatusInput>): IStatusInput => ({
    snapshot: twoGpus(),
    kernelId: 'k-123456789',
    kernelView: null,
    warnPercent: 90,
    connection: live,
    ...over
  });

  it("shows the notebook's GPU only when its kernel uses one", () => {
    const used = statusView(input({}));
    expect(used.state).toBe('gpu');
    expect(used.text).toBe('GPU0 37% 12.1G');
    expect(used.deviceKey).toBe('GPU-aaaa');
    expect(used.description).toContain("This notebook's GPU: cuda:0 NVIDIA H200");
    expect(statusView(input({ kernelId: 'k-other' })).text).toBe('GPU1 0% 512M');
    const none = statusView(input({ kernelId: 'k-new', kernelView: { status: 'ok', device: null } }));
    expect(none.state).toBe('none');
    expect(none.text).toBe('GPU –');
    expect(none.deviceKey).toBeNull();
    expect(none.description).toContain('uses no GPU');
  });

  it('waits for the kernel before naming no GPU', () => {
    expect(statusView(input({ kernelId: 'k-new' }))).toMatchObject({ state: 'unknown', text: 'GPU …' });
    expect(statusView(input({ kernelId: 'k-new', kernelView: { status: 'no-answer', reason: 'busy' } }))).toMatchObject({
      state: 'none',
      text: 'GPU –'
    });
  });

  it('says GPU – without a kernel, after a shutdown, and without a GPU', () => {
    expect(statusView(input({ kernelId: null }))).toMatchObject({ state: 'no-kernel', text: 'GPU –' });
    expect(statusView(input({ kernelView: { status: 'gone' } }))).toMatchObject({ state: 'no-kernel', text: 'GPU –' });
    const noGpu = statusView(input({ snapshot: NO_GPU }));
    expect(noGpu).toMatchObject({ state: 'no-gpu', text: 'GPU –' });
    expect(noGpu.description).toContain('No GPU: NVML reports: libnvidia-ml.so.1 not found');
    expect(statusView(input({ snapshot: null }))).toMatchObject({ state: 'waiting', text: 'GPU …' });
  });

  it('warns above the memory threshold', () => {
    const snap: ISnapshot = twoGpus();
    snap.devices[0].memory_used = 0.92 * snap.devices[0].memory_total!;
    const view = statusView(input({ snapshot: snap }));
    expect(view.warn).toBe(true);
    expect(view.description).toContain('Warning: memory use 92% is above 90%');
    expect(statusView(input({ snapshot: snap, warnPercent: 95 })).warn).toBe(false);
  });

  it('says the state of the data in its badge and its description', () => {
    const at = new Date(2025, 0, 1, 14, 3, 21).getTime();
    const replay = { source: '/data/h200-trace.jsonl', name: 'h200-trace.jsonl', recorded: '2026-11-29' };
    const stale = connectionView({ offline: false, staleFor: 12.4, lastUpdate: at, hasData: true, replay });
    const view = statusView(input({ snapshot: { ...twoGpus(), replay: { source: 'x' } }, connection: stale }));
    expect(view.replay).toBe(true);
    expect(view.stale).toBe(true);
    expect(view.badge).toBe('replay, stale 12 s');
    expect(view.description).toContain('Stale for 12 s: no data from the server since 14:03:21 (a replay of a recorded trace).');
    expect(view.text).toBe('GPU0 37% 12.1G');
    const offline = connectionView({ offline: true, staleFor: 30, lastUpdate: at, hasData: true, replay: null });
    const gone = statusView(input({ connection: offline }));
    expect(gone.badge).toBe('offline');
    expect(gone.description).toContain(`Offline: lost contact with the Jupyter server; retrying… Last update 14:03:21.`);
    expect(statusView(input({})).badge).toBe('');
  });
});

describe('connectionView', () => {
  const base = { offline: false, staleFor: null, lastUpdate: null, hasData: true, replay: null };
  const replay = { source: '/data/t.jsonl', name: 't.jsonl', recorded: '2026-11-29T18:53:45' };

  it('is one state: connecting, live, replay, stale for N s, offline', () => {
    expect(connectionView({ ...base, hasData: false })).toMatchObject({ kind: 'connecting', down: false, badge: '' });
    expect(connectionView(base)).toMatchObject({ kind: 'live', text: 'Live', down: false, badge: '' });
    expect(connectionView({ ...base, replay })).toMatchObject({
      kind: 'replay',
      text: REPLAY_BANNER,
      detail: 't.jsonl, recorded 2026-11-29T18:53:45',
      badge: 'replay'
    });
    const stale = connectionView({ ...base, staleFor: 75, lastUpdate: new Date(2025, 0, 1, 9, 5, 7).getTime() });
    expect(stale).toMatchObject({ kind: 'stale', down: true, badge: 'stale 1 min' });
    expect(stale.text).toBe('Stale for 1 min: no data from the server since 09:05:07');
    expect(stale.spoken).toBe('Stale: no data from the server since 09:05:07'); // said once, not every second
    // an outage wins over staleness: the server is gone, not just quiet
    expect(connectionView({ ...base, staleFor: 75, offline: true })).toMatchObject({ kind: 'offline', down: true });
    expect(OUTAGE_TEXT).toContain('Lost contact with the Jupyter server');
  });
});

describe('notebookActions', () => {
  const input = (over: Partial<INotebookActionsInput>): INotebookActionsInput => ({
    kernelId: 'k-123456789',
    kernelStatus: 'idle',
    view: { status: 'ok', device: null, memory: [] },
    snapshot: twoGpus(),
    down: false,
    ...over
  });

  it('offers Release cache only where there is cached memory or an idle holder', () => {
    expect(notebookActions(input({}))).toEqual(['interrupt', 'restart', 'shutdown']);
    const cached = { ordinal: 0, framework: 'torch', allocated: GIB, reserved: 2 * GIB, peak: 2 * GIB };
    expect(notebookActions(input({ view: { status: 'ok', device: 0, memory: [cached] } }))).toEqual([
      'interrupt',
      'release',
      'restart',
      'shutdown'
    ]);
    const idle = twoGpus();
    idle.devices[0].processes![0].kernel!.idle_holder = true;
    expect(notebookActions(input({ snapshot: idle }))).toContain('release');
  });

  it('offers Suspend on an idle kernel that holds GPU memory where the server can, and Resume, not Release, once suspended', () => {
    const can = twoGpus();
    can.suspend = { available: true };
    expect(notebookActions(input({ snapshot: can }))).toEqual(['interrupt', 'suspend', 'restart', 'shutdown']);
    expect(notebookActions(input({ snapshot: can, kernelStatus: 'busy' }))).toEqual(['interrupt', 'restart', 'shutdown']);
    expect(notebookActions(input({ snapshot: can, kernelId: 'k-elsewhere' }))).not.toContain('suspend');
    expect(notebookActions(input({}))).not.toContain('suspend'); // the server cannot suspend
    const cached = { ordinal: 0, framework: 'torch', allocated: GIB, reserved: 2 * GIB, peak: 2 * GIB };
    const suspended = { status: 'ok', device: 0, memory: [cached], suspend: { state: 'suspended' } };
    expect(notebookActions(input({ snapshot: can, view: suspended }))).toEqual(['interrupt', 'resume', 'restart', 'shutdown']);
  });

  it('offers nothing for a kernel that is gone or dead, nor while the server does not answer', () => {
    expect(notebookActions(input({ view: { status: 'gone' } }))).toEqual([]);
    expect(notebookActions(input({ kernelStatus: 'dead' }))).toEqual([]);
    expect(notebookActions(input({ down: true }))).toEqual([]);
    expect(notebookActions(input({ kernelId: null }))).toEqual([]);
  });
});

describe('kernelRows', () => {
  it("shows the kernel's host memory and CPU beside its GPU memory", () => {
    const rows = kernelRows(
      { status: 'ok', device: 0, memory: [{ ordinal: 0, framework: 'torch', allocated: GIB, reserved: GIB, peak: GIB }] },
      { memory: 1.2 * GIB, cpu_percent: 37.4, processes: 3 }
    );
    expect(rows[2]).toEqual({ label: 'Host', value: '1.20 GiB memory, 37% CPU (3 processes)' });
    expect(kernelRows(null, { memory: 55 * 1024 ** 2, cpu_percent: 0, processes: 1 })[1]).toEqual({
      label: 'Host',
      value: '55.0 MiB memory, 0% CPU'
    });
    expect(hostUsageText(null)).toBeNull();
  });

  it('shows the device, allocator memory and warm-up state of a kernel that answered', () => {
    const rows = kernelRows({
      status: 'ok',
      device: 1,
      device_source: '%gpu use',
      memory: [{ ordinal: 1, framework: 'torch', allocated: GIB, reserved: 2 * GIB, peak: 1.5 * GIB }],
      warmup: { state: 'done', device: 1, total: 3.914 }
    });
    expect(rows).toEqual([
      { label: 'Device', value: 'cuda:1 (%gpu use)' },
      { label: 'cuda:1 torch', value: '1.00 GiB allocated, 2.00 GiB reserved, 1.50 GiB peak' },
      { label: 'Warm-up', value: 'done on cuda:1 in 3.91 s' }
    ]);
  });

  it('keeps a long warm-up reason out of the way, as a detail', () => {
    const detail = 'imported torch only; no GPU is visible: NVML reports: libnvidia-ml.so.1 not found';
    expect(kernelRows({ status: 'ok', device: null, memory: [], warmup: { state: 'skipped', detail } })).toEqual([
      { label: 'Device', value: 'none (no GPU in use)' },
      { label: 'Warm-up', value: 'skipped', detail }
    ]);
  });

  it('says when the kernel came from the warm pool', () => {
    const rows = kernelRows({ status: 'ok', device: 0, pooled: true, warmup: { state: 'done', device: 0, total: 4 } });
    expect(rows[rows.length - 1]).toEqual({ label: 'Started', value: 'from the warm pool' });
    expect(kernelRows({ status: 'ok', device: 0, pooled: false }).map(r => r.label)).not.toContain('Started');
  });

  it('says why a kernel did not answer, that it is gone, or that the server is unreachable', () => {
    expect(kernelRows({ status: 'no-answer', reason: 'gpuctx is not loaded' })).toEqual([
      { label: 'GPU view', value: 'no answer: gpuctx is not loaded' }
    ]);
    expect(kernelRows(null)[0].value).toBe('asking the kernel…');
    expect(kernelRows({ status: 'gone' })[0].value).toBe('the kernel is no longer running');
    expect(kernelRows({ status: 'unreachable' })[0].value).not.toContain('Failed to fetch');
  });

  it('summarises every warm-up state', () => {
    expect(warmupSummary({ status: 'ok', warmup: { state: 'running', phase: 'matmul_fp32', device: 0 } })).toEqual({
      summary: 'running on cuda:0 (now: matmul fp32)',
      detail: null
    });
    expect(warmupSummary({ status: 'ok', warmup: { state: 'off', detail: 'policy never' } })).toEqual({
      summary: 'off',
      detail: 'policy never'
    });
    expect(warmupSummary({ status: 'ok', warmup: { state: 'failed', detail: 'no torch' } })).toEqual({
      summary: 'failed',
      detail: 'no torch'
    });
    expect(warmupSummary({ status: 'ok' }).summary).toBe('unknown');
  });
});

describe('reserveView', () => {
  it('is null when the server keeps no pool, so the panel shows nothing', () => {
    expect(reserveView(null)).toBeNull();
    expect(reserveView(undefined)).toBeNull();
    expect(panelView(twoGpus()).reserve).toBeNull();
  });

  it('lists a ready standby: kernelspec, kind, GPU, memory, the notebook it warmed for, RSS, ready', () => {
    expect(reserveView(readyPool())).toEqual({
      headline: 'Warm reserve: 1 kernel ready',
      lines: [
        'python3 · GPU-ready · GPU 0 · 630 MiB · warmed for train.ipynb · RSS 1.76 GiB · ready',
        'Restart of this notebook is GPU-ready: train.ipynb',
        "Standbys' host memory: 1.76 / 4.80 GiB budget (machine)"
      ],
      tone: 'normal'
    });
    expect(panelView({ ...twoGpus(), pool: readyPool() }).reserve?.headline).toBe('Warm reserve: 1 kernel ready');
  });

  it("names each standby's kind and state with its RSS, and the budget a container's limit bounds", () => {
    const pool = readyPool();
    pool.standbys = [
      { kernel_name: 'python3', kind: 'imports', pid: 1, ready: false, state: 'paused', age: 3, ordinal: null, notebook: null, memory: null, rss: 300 * MIB },
      { kernel_name: 'python3', kind: 'imports', pid: 2, ready: false, state: 'booting', age: 1, ordinal: null, notebook: null, memory: null, rss: null },
      { kernel_name: 'python3', kind: 'imports', pid: 3, ready: true, state: 'ready', age: 9, ordinal: null, notebook: null, memory: null, rss: 1.3 * GIB },
      { kernel_name: 'python3', kind: 'gpu', pid: 4, ready: false, state: 'stopping', age: 60, ordinal: 1, notebook: null, memory: 630 * MIB, rss: 2 * GIB }
    ];
    pool.host_memory = { standbys: 3.59 * GIB, budget: 6.4 * GIB, available: 28.4 * GIB, limit: 'cgroup' };
    const view = reserveView(pool)!;
    expect(view.lines).toEqual([
      'python3 · imports · RSS 300 MiB · paused',
      'python3 · imports · starting',
      'python3 · imports · RSS 1.30 GiB · ready',
      'python3 · GPU-ready · GPU 1 · 630 MiB · RSS 2.00 GiB · stopping',
      'Restart of this notebook is GPU-ready: train.ipynb',
      "Standbys' host memory: 3.59 / 6.40 GiB budget (container)"
    ]);
    // without a reading of the memory available (no /proc), what they hold and no budget
    pool.host_memory = { standbys: 1.3 * GIB, budget: 0, available: null, limit: null };
    expect(reserveView(pool)!.lines.slice(-1)[0]).toBe("Standbys' host memory: 1.30 GiB");
    // no standby, no budget line: the reason is the line a person needs
    expect(reserveView({ ...EMPTY_POOL, host_memory: pool.host_memory })!.lines).toEqual([EMPTY_POOL.reason]);
  });

  it('says "starting" while its standbys boot, and calls restart GPU-ready only once one is ready', () => {
    const pool = readyPool();
    pool.host_memory = null; // standbys as a server before kind, state and RSS lists them
    pool.standbys = [
      { kernel_name: 'python3', pid: 1, ready: false, age: 2, ordinal: null, notebook: null, memory: null },
      { kernel_name: 'python3', pid: 2, ready: false, age: 1, ordinal: 1, notebook: 'b/eval.ipynb', memory: null }
    ];
    pool.kernelspecs!.python3 = { ...pool.kernelspecs!.python3, ready: 0, wanted_for: ['work/train.ipynb', 'b/eval.ipynb'] };
    pool.kernelspecs!.other = { ready: 0, wanted_for: ['work/train.ipynb'] };
    const view = reserveView(pool)!;
    expect(view.headline).toBe('Warm reserve: starting');
    expect(view.lines).toEqual([
      'python3 · starting',
      'python3 · GPU 1 · warmed for eval.ipynb · starting'
    ]);
    pool.standbys[1].ready = true; // ready: the notebooks that keep it are named, once each
    expect(reserveView(pool)!.lines.slice(-1)[0]).toBe('Restart of these notebooks is GPU-ready: train.ipynb, eval.ipynb');
    // counted by kernelspec before the standby is listed (an older server)
    expect(reserveView({ target: 1, kernelspecs: { python3: { ready: 0, starting: 1 } }, standbys: [] })!.headline).toBe(
      'Warm reserve: starting'
    );
  });

  it('gives the reason when it is empty: the top-level one, else the first kernelspec\'s', () => {
    expect(reserveView(EMPTY_POOL)).toEqual({
      headline: 'Warm reserve: empty',
      lines: ['no GPU notebook is running: the reserve starts once one runs'],
      tone: 'normal'
    });
    const { reason, ...withoutTopReason } = EMPTY_POOL;
    expect(reason).toBeTruthy();
    expect(reserveView(withoutTopReason)!.lines).toEqual(['no GPU notebook is running']);
  });

  it('warns in words when standbys fail to start', () => {
    const error = 'kernel died during start-up';
    const empty = reserveView({
      mode: 'fixed',
      target: 1,
      kernelspecs: { python3: { ready: 0, failures: 3, error, reason: `standbys fail to start (3 in a row): ${error}` } },
      standbys: []
    })!;
    expect(empty.tone).toBe('warn');
    expect(empty.headline).toBe('Warm reserve: empty');
    expect(empty.lines).toEqual([`standbys fail to start (3 in a row): ${error}`]); // said once
    const pool = readyPool();
    pool.kernelspecs!.r = { ready: 0, failures: 1, error: 'no such kernelspec', reason: null };
    const view = reserveView(pool)!;
    expect(view.tone).toBe('warn');
    expect(view.lines).toContain('r standbys fail to start: no such kernelspec');
  });

  it('says the status is unavailable when the server could not read it', () => {
    expect(reserveView({ error: 'pool stopped' })).toEqual({
      headline: 'Warm reserve: status unavailable (pool stopped)',
      lines: [],
      tone: 'warn'
    });
  });

  it("reads an older server's pool (no mode, reason, ordinal, notebook or memory)", () => {
    const view = reserveView({
      target: 2,
      kernelspecs: { python3: { ready: 2, starting: 0, failures: 0, error: null, reason: null } },
      standbys: [
        { kernel_name: 'python3', pid: 10, ready: true, age: 5 },
        { kernel_name: 'python3', pid: 11, ready: true, age: 4 }
      ],
      refused: []
    })!;
    expect(view).toEqual({
      headline: 'Warm reserve: 2 kernels ready',
      lines: ['python3 · ready', 'python3 · ready'],
      tone: 'normal'
    });
    expect(reserveView({ target: 0, kernelspecs: {}, standbys: [] })).toEqual({
      headline: 'Warm reserve: empty',
      lines: [],
      tone: 'normal'
    });
  });
});

describe('suspended notebooks', () => {
  const since = 1_764_470_000;
  const at = formatClock(since * 1000, false);

  function suspendedSnapshot(available = true): ISnapshot {
    const snap = twoGpus();
    snap.suspend = { available, reason: available ? 'driver 580.159.04 (CUDA 13.0)' : 'no driver' };
    snap.suspended = [{ kernel_id: 'k-away', name: 'python3', paths: ['x/away.ipynb'], since, moved: { '0': 60 * GIB },
                        moved_total: 60 * GIB }];
    snap.devices[0].suspended = [{ kernel: { id: 'k-away', name: 'python3', paths: ['x/away.ipynb'] }, bytes: 60 * GIB,
                                   since }];
    snap.devices[0].processes![0].kernel!.execution_state = 'idle';
    return snap;
  }

  it('are named as such on the GPU they came from, and idle kernels can be suspended where the server can', () => {
    const view = panelView(suspendedSnapshot());
    expect(suspendedText(60 * GIB, since)).toBe(`suspended: 60.0 GiB in host memory since ${at}`);
    expect(view.devices[0].suspended).toEqual([{
      kernelId: 'k-away', label: 'away.ipynb', text: `suspended: 60.0 GiB in host memory since ${at}`,
      description: `away.ipynb is suspended: 60.0 GiB in host memory since ${at} (from cuda:0); it resumes on its ` +
        'next cell, or with Resume'
    }]);
    expect(view.devices[1].suspended).toEqual([]);
    expect(view.devices[0].processes[0].canSuspend).toBe(true);
    expect(panelView(suspendedSnapshot(false)).devices[0].processes[0].canSuspend).toBe(false);
    const busy = suspendedSnapshot();
    busy.devices[0].processes![0].kernel!.execution_state = 'busy';
    expect(panelView(busy).devices[0].processes[0].canSuspend).toBe(false);
  });

  it('show in the status bar and in the notebook section', () => {
    const connection = connectionView({ offline: false, staleFor: null, lastUpdate: null, hasData: true, replay: null });
    const input: IStatusInput = { snapshot: suspendedSnapshot(), kernelId: 'k-away', kernelView: null, warnPercent: 90,
                                  connection };
    const status = statusView(input);
    expect(status.state).toBe('suspended');
    expect(status.text).toBe('GPU0 suspended');
    expect(status.description).toContain(`This notebook is suspended: 60.0 GiB in host memory since ${at}; it resumes`);
    const rows = kernelRows({ status: 'ok', device: 0, memory: [], warmup: { state: 'done' },
                              suspend: { state: 'suspended', since, moved: { '0': 60 * GIB }, error: 'no room' } });
    const row = rows.find(r => r.label === 'GPU memory')!;
    expect(row.value).toBe(`suspended: 60.0 GiB in host memory since ${at}; it resumes on its next cell`);
    expect(row.detail).toBe('The last resume failed: no room');
  });

  it('that culling or the pressure release suspended are told apart from those they shut down or released', () => {
    const lines = reclaimedLines({
      released: [{ kernel_id: 'k1', paths: ['a.ipynb'], released_total: 8 * GIB, time: 20, action: 'suspend' }],
      culled: [{ kernel_id: 'k2', paths: ['b.ipynb'], freed: 1, bytes: 2 * GIB, time: 10, action: 'suspend' }]
    });
    expect(lines[0]).toMatch(/Suspended idle a\.ipynb \(the GPU ran short\), moving 8\.00 GiB to host memory$/);
    expect(lines[1]).toMatch(/Suspended idle b\.ipynb, freeing 2\.00 GiB$/);
  });
});
