import { describe, expect, it } from 'vitest';

import {
  deviceForKernel,
  describeProcess,
  kernelRows,
  panelView,
  REPLAY_BANNER,
  statusDescription,
  statusText,
  warmupText
} from '../src/model';
import { GIB, NO_GPU, twoGpus } from './fixtures';

describe('panelView', () => {
  it('carries the server reason when there is no GPU', () => {
    const view = panelView(NO_GPU);
    expect(view.noGpu).toBe('NVML reports: libnvidia-ml.so.1 not found');
    expect(view.devices).toEqual([]);
    expect(view.replay).toBeNull();
  });

  it('titles cards by CUDA ordinal with the nvidia-smi index beside', () => {
    const view = panelView(twoGpus());
    expect(view.noGpu).toBeNull();
    expect(view.devices.map(d => d.title)).toEqual(['cuda:0 · NVIDIA H200', 'cuda:1 · NVIDIA H200']);
    expect(view.devices[0].subtitle).toBe('nvidia-smi 1 · GPU-aaaa');
    expect(view.devices[0].utilizationText).toBe('37%');
    expect(view.devices[0].memoryText).toBe('12.1 GiB / 140.4 GiB');
    expect(view.devices[0].powerText).toBe('120 / 700 W');
  });

  it('names processes by notebook, kernel, process name or PID', () => {
    const [nb, other] = panelView(twoGpus()).devices[0].processes;
    expect(nb.label).toBe('train.ipynb');
    expect(nb.kernelId).toBe('k-123456789');
    expect(nb.executionState).toBe('busy');
    expect(nb.description).toContain('work/train.ipynb');
    expect(other.label).toBe('python (PID 77)');
    expect(other.kernelId).toBeNull();
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

  it('shows the replay banner data only when the snapshot says replay', () => {
    const replay = panelView({ ...NO_GPU, replay: { source: 'h200.jsonl', recorded: '2025-01-01' } });
    expect(replay.replay).toEqual({ source: 'h200.jsonl', recorded: '2025-01-01' });
  });
});

describe('the notebook GPU and the status bar', () => {
  it('says no GPU without one, and marks replay', () => {
    expect(statusText(NO_GPU, 'k', null)).toBe('no GPU');
    expect(statusText({ ...NO_GPU, replay: { source: 'x' } }, 'k', null)).toBe('no GPU (replay)');
    expect(statusText(null, null, null)).toBe('GPU …');
    expect(statusDescription(NO_GPU, 'k', null)).toContain('libnvidia-ml.so.1 not found');
    expect(statusDescription({ ...NO_GPU, replay: {} }, 'k', null)).toContain(REPLAY_BANNER);
  });

  it("prefers the kernel's own device, then where its process is, then cuda:0", () => {
    const snap = twoGpus();
    expect(deviceForKernel(snap, 'k-other', { status: 'ok', device: 0 })?.ordinal).toBe(0);
    expect(deviceForKernel(snap, 'k-other', null)?.ordinal).toBe(1);
    expect(deviceForKernel(snap, 'k-other', { status: 'no-answer' })?.ordinal).toBe(1);
    expect(deviceForKernel(snap, 'unknown', null)?.ordinal).toBe(0);
    expect(statusText(snap, 'k-123456789', null)).toBe('GPU0 37% 12.1G');
    expect(statusText(snap, 'k-other', null)).toBe('GPU1 0% 512M');
  });
});

describe('kernelRows', () => {
  it('shows the device, allocator memory and warm-up state of a kernel that answered', () => {
    const rows = kernelRows({
      status: 'ok',
      device: 1,
      device_source: '%gpu use',
      memory: [{ ordinal: 1, framework: 'torch', allocated: GIB, reserved: 2 * GIB, peak: 1.5 * GIB }],
      warmup: { state: 'done', device: 1, total: 3.91 }
    });
    expect(rows).toEqual([
      { label: 'Device', value: 'cuda:1 (%gpu use)' },
      { label: 'cuda:1 torch', value: '1.0 GiB allocated, 2.0 GiB reserved, 1.5 GiB peak' },
      { label: 'Warm-up', value: 'done on cuda:1 in 3.9 s' }
    ]);
  });

  it('says when the kernel came from the warm pool', () => {
    const rows = kernelRows({ status: 'ok', device: 0, pooled: true, warmup: { state: 'done', device: 0, total: 4 } });
    expect(rows[rows.length - 1]).toEqual({ label: 'Started', value: 'from the warm pool' });
    expect(kernelRows({ status: 'ok', device: 0, pooled: false }).map(r => r.label)).not.toContain('Started');
  });

  it('says why a kernel did not answer', () => {
    expect(kernelRows({ status: 'no-answer', reason: 'gpuctx is not loaded' })).toEqual([
      { label: 'GPU view', value: 'no answer: gpuctx is not loaded' }
    ]);
    expect(kernelRows(null)[0].value).toBe('asking the kernel…');
  });

  it('describes every warm-up state', () => {
    expect(warmupText({ status: 'ok', warmup: { state: 'running', phase: 'matmul_fp32', device: 0 } })).toBe(
      'running on cuda:0 (now: matmul fp32)'
    );
    expect(warmupText({ status: 'ok', warmup: { state: 'off', detail: 'policy never' } })).toBe('off (policy never)');
    expect(warmupText({ status: 'ok', warmup: { state: 'failed', detail: 'no torch' } })).toBe('failed: no torch');
    expect(warmupText({ status: 'ok' })).toBe('unknown');
  });
});
