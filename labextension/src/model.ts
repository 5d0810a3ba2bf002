/**
 * Snapshot → what the panel and the status bar show. Plain data in, plain data out, so that
 * every rule here (naming processes, choosing the notebook's GPU, the replay mark) is tested
 * without a browser.
 */
import {
  basename,
  formatBytes,
  formatBytesShort,
  formatMemory,
  formatPercent,
  formatPower,
  formatSeconds,
  formatTemperature,
  memoryFraction
} from './format';
import { IGpuDevice, IGpuProcess, IKernelView, ISnapshot } from './types';

export const REPLAY_BANNER = 'Replay of a recorded trace — not live data';

export interface IProcessView {
  pid: number;
  /** What a person recognises: the notebook, else the kernel or process name, else the PID. */
  label: string;
  /** Longer text for the tooltip / screen readers. */
  description: string;
  memory: string;
  /** Set when the process is one of this server's kernels: the actions apply to it. */
  kernelId: string | null;
  executionState: string | null;
}

export interface IDeviceView {
  key: string;
  ordinal: number;
  title: string;
  subtitle: string;
  error: string | null;
  utilization: number | null;
  utilizationText: string;
  memoryFraction: number | null;
  memoryText: string;
  temperatureText: string;
  powerText: string;
  processes: IProcessView[];
}

export interface IPanelView {
  replay: { source: string; recorded: string } | null;
  /** Set when there is no GPU to show: the server's reason. */
  noGpu: string | null;
  devices: IDeviceView[];
  notes: string[];
}

export function isReplay(snapshot: ISnapshot | null | undefined): boolean {
  return !!snapshot && !!snapshot.replay;
}

export function describeProcess(p: IGpuProcess): IProcessView {
  const memory = formatBytes(p.used_memory);
  const kernel = p.kernel;
  if (kernel) {
    const paths = kernel.paths ?? [];
    const kernelName = kernel.name || 'kernel';
    const label = paths.length ? paths.map(basename).join(', ') : `${kernelName} kernel ${kernel.id.slice(0, 8)}`;
    const state = kernel.execution_state ?? null;
    const where = paths.length ? paths.join(', ') : 'no notebook';
    return {
      pid: p.pid,
      label,
      description: `${where} — ${kernelName} kernel ${kernel.id}, PID ${p.pid}${state ? `, ${state}` : ''}`,
      memory,
      kernelId: kernel.id,
      executionState: state
    };
  }
  const label = p.name ? `${p.name} (PID ${p.pid})` : `PID ${p.pid}`;
  return {
    pid: p.pid,
    label,
    description: `${label}: not a kernel of this server`,
    memory,
    kernelId: null,
    executionState: null
  };
}

export function describeDevice(d: IGpuDevice): IDeviceView {
  const smi = typeof d.nvml_index === 'number' ? `nvidia-smi ${d.nvml_index}` : '';
  return {
    key: d.uuid || `cuda:${d.ordinal}`,
    ordinal: d.ordinal,
    title: `cuda:${d.ordinal} · ${d.name}`,
    subtitle: [smi, d.uuid].filter(Boolean).join(' · '),
    error: d.error || null,
    utilization: typeof d.utilization === 'number' ? d.utilization : null,
    utilizationText: formatPercent(d.utilization),
    memoryFraction: memoryFraction(d.memory_used, d.memory_total),
    memoryText: formatMemory(d.memory_used, d.memory_total),
    temperatureText: formatTemperature(d.temperature),
    powerText: formatPower(d.power_w, d.power_limit_w),
    processes: (d.processes ?? []).map(describeProcess)
  };
}

export function panelView(snapshot: ISnapshot): IPanelView {
  const replay = snapshot.replay
    ? { source: snapshot.replay.source ?? 'unknown source', recorded: snapshot.replay.recorded ?? '' }
    : null;
  const devices = (snapshot.devices ?? []).map(describeDevice);
  let noGpu: string | null = null;
  if (!snapshot.gpu || devices.length === 0) {
    noGpu = snapshot.reason || 'The server sees no GPU.';
  }
  const notes = [...(snapshot.notes ?? [])];
  const hidden = snapshot.hidden ?? [];
  if (hidden.length) {
    const names = hidden.map(h => (typeof h.nvml_index === 'number' ? `nvidia-smi ${h.nvml_index} ${h.name}` : h.name));
    notes.push(`Not visible to this server's kernels (CUDA_VISIBLE_DEVICES): ${names.join(', ')}`);
  }
  return { replay, noGpu, devices, notes };
}

/**
 * The GPU a notebook's kernel works on: what the kernel itself says first, then the GPU its
 * process is listed on, then CUDA's default (ordinal 0) when there is any GPU at all.
 */
export function deviceForKernel(
  snapshot: ISnapshot,
  kernelId: string | null,
  view: IKernelView | null
): IGpuDevice | null {
  const devices = snapshot.devices ?? [];
  if (!snapshot.gpu || devices.length === 0) {
    return null;
  }
  if (view && view.status === 'ok' && typeof view.device === 'number') {
    const own = devices.find(d => d.ordinal === view.device);
    if (own) {
      return own;
    }
  }
  if (kernelId) {
    const listed = devices.find(d => (d.processes ?? []).some(p => p.kernel?.id === kernelId));
    if (listed) {
      return listed;
    }
  }
  return devices.find(d => d.ordinal === 0) ?? devices[0];
}

/** The status bar text, e.g. "GPU0 37% 12.1G", "no GPU", with " (replay)" on replayed data. */
export function statusText(snapshot: ISnapshot | null, kernelId: string | null, view: IKernelView | null): string {
  if (!snapshot) {
    return 'GPU …';
  }
  const device = deviceForKernel(snapshot, kernelId, view);
  const text = device
    ? `GPU${device.ordinal} ${formatPercent(device.utilization)} ${formatBytesShort(device.memory_used)}`
    : 'no GPU';
  return isReplay(snapshot) ? `${text} (replay)` : text;
}

/** The status bar's longer description for its tooltip and aria-label. */
export function statusDescription(snapshot: ISnapshot | null, kernelId: string | null, view: IKernelView | null): string {
  if (!snapshot) {
    return 'GPU: waiting for the gpuctx server. Click to open the GPU panel.';
  }
  const device = deviceForKernel(snapshot, kernelId, view);
  const replay = isReplay(snapshot) ? ` ${REPLAY_BANNER}.` : '';
  if (!device) {
    return `No GPU: ${snapshot.reason || 'the server sees none'}.${replay} Click to open the GPU panel.`;
  }
  return (
    `This notebook's GPU: cuda:${device.ordinal} ${device.name}, utilisation ${formatPercent(device.utilization)}, ` +
    `memory ${formatMemory(device.memory_used, device.memory_total)}.${replay} Click to open the GPU panel.`
  );
}

export interface IKernelRow {
  label: string;
  value: string;
}

/** The "this notebook" section: the kernel's own answer as label/value rows. */
export function kernelRows(view: IKernelView | null): IKernelRow[] {
  if (!view) {
    return [{ label: 'GPU view', value: 'asking the kernel…' }];
  }
  if (view.status !== 'ok') {
    const why = view.reason || view.message || view.status;
    return [{ label: 'GPU view', value: `no answer: ${why}` }];
  }
  const rows: IKernelRow[] = [];
  const device =
    typeof view.device === 'number'
      ? `cuda:${view.device}${view.device_source ? ` (${view.device_source})` : ''}`
      : 'none (no GPU in use)';
  rows.push({ label: 'Device', value: device });
  const memory = view.memory ?? [];
  if (memory.length === 0) {
    rows.push({ label: 'Allocator', value: 'nothing allocated' });
  }
  for (const m of memory) {
    rows.push({
      label: `cuda:${m.ordinal}${m.framework ? ` ${m.framework}` : ''}`,
      value: `${formatBytes(m.allocated)} allocated, ${formatBytes(m.reserved)} reserved, ${formatBytes(m.peak)} peak`
    });
  }
  rows.push({ label: 'Warm-up', value: warmupText(view) });
  if (view.pooled) {
    rows.push({ label: 'Started', value: 'from the warm pool' });
  }
  return rows;
}

export function warmupText(view: IKernelView): string {
  const w = view.warmup;
  if (!w || !w.state) {
    return 'unknown';
  }
  const where = typeof w.device === 'number' ? ` on cuda:${w.device}` : '';
  switch (w.state) {
    case 'running':
      return `running${where}${w.phase ? ` (now: ${w.phase.replace(/_/g, ' ')})` : ''}`;
    case 'done':
      return `done${where}${typeof w.total === 'number' ? ` in ${formatSeconds(w.total)}` : ''}`;
    case 'off':
      return w.detail ? `off (${w.detail})` : 'off';
    default:
      return w.detail ? `${w.state}: ${w.detail}` : w.state;
  }
}
