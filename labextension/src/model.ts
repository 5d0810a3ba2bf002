/**
 * Snapshot → what the panel and the status bar show. Plain data in, plain data out, so that
 * every rule here (naming processes, which GPU a notebook uses, the memory warning, the replay
 * mark) is tested without a browser.
 */
import {
  basename,
  formatBytes,
  formatBytesShort,
  formatClock,
  formatMemory,
  formatPercent,
  formatPower,
  formatSeconds,
  formatTemperature,
  memoryFraction
} from './format';
import { deviceKey, IGpuDevice, IGpuProcess, IKernelView, ISnapshot } from './types';

export const REPLAY_BANNER = 'Replay of a recorded trace — not live data';

/** Shown while the server does not answer (instead of the browser's "Failed to fetch"). */
export const OUTAGE_TEXT = 'Lost contact with the Jupyter server; retrying…';

const CLICK = 'Click to open the GPU panel.';

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
  /** "cuda:0 · NVIDIA H200". */
  title: string;
  /** "cuda:0": the compact row's name. */
  shortName: string;
  /** Visible under the title: nvidia-smi's index. */
  subtitle: string;
  /** Everything that identifies the board (UUID, PCI bus), for a tooltip only. */
  tooltip: string;
  error: string | null;
  utilization: number | null;
  utilizationText: string;
  memoryFraction: number | null;
  /** "5.70 GiB / 140 GiB". */
  memoryText: string;
  /** "5.70 GiB": the compact row's figure. */
  memoryUsedText: string;
  /** Memory use is at or above the warning threshold. */
  memoryWarn: boolean;
  temperatureText: string;
  powerText: string;
  processes: IProcessView[];
  /** The process holding most memory, preferring notebooks: the compact row names it. */
  top: IProcessView | null;
}

export interface IReplayView {
  /** The trace's full path (for the tooltip). */
  source: string;
  /** Its file name (the visible text). */
  name: string;
  recorded: string;
}

export interface IPanelView {
  replay: IReplayView | null;
  /** Set when there is no GPU to show: the server's reason. */
  noGpu: string | null;
  devices: IDeviceView[];
  notes: string[];
}

export function isReplay(snapshot: ISnapshot | null | undefined): boolean {
  return !!snapshot && !!snapshot.replay;
}

/** The memory warning as a fraction 0..1 of a GPU's total, from the setting in percent. */
export function warnFraction(percent: number): number {
  return Math.min(1, Math.max(0, percent / 100));
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

/** The process a compact row names: a notebook's kernel before anything else, then the most memory. */
function topProcess(processes: IGpuProcess[]): IGpuProcess | null {
  const ranked = [...processes].sort((a, b) => {
    const nb = Number(!!b.kernel?.paths?.length) - Number(!!a.kernel?.paths?.length);
    return nb !== 0 ? nb : (b.used_memory ?? 0) - (a.used_memory ?? 0);
  });
  return ranked[0] ?? null;
}

export function describeDevice(d: IGpuDevice, warnAt = warnFraction(90)): IDeviceView {
  const smi = typeof d.nvml_index === 'number' ? `nvidia-smi ${d.nvml_index}` : '';
  const fraction = memoryFraction(d.memory_used, d.memory_total);
  const processes = d.processes ?? [];
  const top = topProcess(processes);
  return {
    key: deviceKey(d),
    ordinal: d.ordinal,
    title: `cuda:${d.ordinal} · ${d.name}`,
    shortName: `cuda:${d.ordinal}`,
    subtitle: smi,
    tooltip: [
      `cuda:${d.ordinal} ${d.name}`,
      smi,
      d.uuid && `UUID ${d.uuid}`,
      d.pci_bus_id && `PCI ${d.pci_bus_id}`
    ]
      .filter(Boolean)
      .join('\n'),
    error: d.error || null,
    utilization: typeof d.utilization === 'number' ? d.utilization : null,
    utilizationText: formatPercent(d.utilization),
    memoryFraction: fraction,
    memoryText: formatMemory(d.memory_used, d.memory_total),
    memoryUsedText: formatBytes(d.memory_used),
    memoryWarn: fraction !== null && fraction >= warnAt,
    temperatureText: formatTemperature(d.temperature),
    powerText: formatPower(d.power_w, d.power_limit_w),
    processes: processes.map(describeProcess),
    top: top ? describeProcess(top) : null
  };
}

export function panelView(snapshot: ISnapshot, warnAt = warnFraction(90)): IPanelView {
  const replay = snapshot.replay
    ? {
        source: snapshot.replay.source ?? 'unknown source',
        name: basename(snapshot.replay.source ?? 'unknown source'),
        recorded: snapshot.replay.recorded ?? ''
      }
    : null;
  const devices = (snapshot.devices ?? []).map(d => describeDevice(d, warnAt));
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

/** The GPU a notebook's kernel uses, and the evidence for it. */
export interface IKernelGpu {
  device: IGpuDevice;
  /** Why this GPU, in words: "chosen by the server (least-used)". */
  why: string;
}

/**
 * The GPU a notebook's kernel actually uses, or null when it uses none. Evidence, strongest
 * first: the kernel reports a chosen device; its process is listed on a GPU (it holds memory
 * there); its allocator holds memory on a device; it started a CUDA context (on CUDA's default
 * device, ordinal 0). A kernel with none of these uses no GPU, whatever the server has.
 */
export function kernelGpu(snapshot: ISnapshot, kernelId: string | null, view: IKernelView | null): IKernelGpu | null {
  const devices = snapshot.devices ?? [];
  if (!snapshot.gpu || devices.length === 0 || !kernelId) {
    return null;
  }
  const byOrdinal = (ordinal: number) => devices.find(d => d.ordinal === ordinal) ?? null;
  const ok = view && view.status === 'ok' ? view : null;
  if (ok && typeof ok.device === 'number') {
    const chosen = byOrdinal(ok.device);
    if (chosen) {
      return { device: chosen, why: ok.device_source ? `chosen by ${ok.device_source}` : 'the kernel reports it' };
    }
  }
  const listed = devices.find(d => (d.processes ?? []).some(p => p.kernel?.id === kernelId));
  if (listed) {
    return { device: listed, why: 'its process holds memory there' };
  }
  const memory = [...(ok?.memory ?? [])].sort((a, b) => b.reserved - a.reserved);
  for (const m of memory) {
    const held = byOrdinal(m.ordinal);
    if (held) {
      return { device: held, why: 'its allocator holds memory there' };
    }
  }
  if (ok && (ok.cuda_started ?? []).length > 0) {
    const fallback = byOrdinal(0);
    if (fallback) {
      return { device: fallback, why: `${ok.cuda_started!.join(', ')} started CUDA on its default device` };
    }
  }
  return null;
}

/** What the status bar knows about the active notebook. */
export type StatusState = 'waiting' | 'no-kernel' | 'no-gpu' | 'unknown' | 'none' | 'gpu';

export interface IStatusInput {
  snapshot: ISnapshot | null;
  /** The active notebook's kernel, null without one. */
  kernelId: string | null;
  kernelView: IKernelView | null;
  warnPercent: number;
  stale: boolean;
  /** When the last snapshot arrived (ms since the epoch), for "last update". */
  lastUpdate: number | null;
  outage: boolean;
}

export interface IStatusView {
  state: StatusState;
  /** "GPU0 37% 12.1G", "GPU –", "GPU …" (without the replay mark). */
  text: string;
  /** The tooltip and accessible name. */
  description: string;
  replay: boolean;
  warn: boolean;
  stale: boolean;
  /** The GPU shown, as `deviceKey` makes it; null when none is. */
  deviceKey: string | null;
}

/** The status bar item for the active notebook: its GPU only when its kernel uses one. */
export function statusView(input: IStatusInput): IStatusView {
  const { snapshot, kernelId, kernelView: view } = input;
  const replay = isReplay(snapshot);
  const notes: string[] = [];
  if (input.stale && input.lastUpdate !== null) {
    notes.push(`Stale: last update ${formatClock(input.lastUpdate)}.`);
  }
  if (input.outage) {
    notes.push(OUTAGE_TEXT);
  }
  if (replay) {
    notes.push(`${REPLAY_BANNER}.`);
  }
  notes.push(CLICK);
  const base = { replay, warn: false, stale: input.stale, deviceKey: null };
  const make = (state: StatusState, text: string, what: string): IStatusView => ({
    ...base,
    state,
    text,
    description: [what, ...notes].join(' ')
  });

  if (!snapshot) {
    return make('waiting', 'GPU …', 'GPU: waiting for the gpuctx server.');
  }
  if (!kernelId || view?.status === 'gone') {
    return make('no-kernel', 'GPU –', 'GPU: this notebook has no running kernel, so it uses no GPU.');
  }
  if (!snapshot.gpu || (snapshot.devices ?? []).length === 0) {
    return make('no-gpu', 'GPU –', `No GPU: ${snapshot.reason || 'the server sees none'}.`);
  }
  const used = kernelGpu(snapshot, kernelId, view);
  if (!used) {
    if (!view) {
      return make('unknown', 'GPU …', "GPU: asking this notebook's kernel which GPU it uses.");
    }
    if (view.status !== 'ok') {
      const why = view.reason || view.message || view.status;
      const what = `GPU: this notebook's kernel did not say which GPU it uses (${why}); it holds no GPU memory.`;
      return make('none', 'GPU –', what);
    }
    return make('none', 'GPU –', "GPU: this notebook's kernel uses no GPU (no CUDA context, no GPU memory).");
  }
  const d = used.device;
  const fraction = memoryFraction(d.memory_used, d.memory_total);
  const warn = fraction !== null && fraction >= warnFraction(input.warnPercent);
  const what =
    `This notebook's GPU: cuda:${d.ordinal} ${d.name} (${used.why}), utilisation ${formatPercent(d.utilization)}, ` +
    `memory ${formatMemory(d.memory_used, d.memory_total)}.` +
    (warn
      ? ` Warning: memory use ${formatPercent((fraction ?? 0) * 100)} is above ${formatPercent(input.warnPercent)}.`
      : '');
  return {
    ...make('gpu', `GPU${d.ordinal} ${formatPercent(d.utilization)} ${formatBytesShort(d.memory_used)}`, what),
    warn,
    deviceKey: deviceKey(d)
  };
}

export interface IKernelRow {
  label: string;
  value: string;
  /** Longer text, shown collapsed under the value (a <details> element). */
  detail?: string;
}

/** The "this notebook" section: the kernel's own answer as label/value rows. */
export function kernelRows(view: IKernelView | null): IKernelRow[] {
  if (!view) {
    return [{ label: 'GPU view', value: 'asking the kernel…' }];
  }
  if (view.status === 'gone') {
    return [{ label: 'GPU view', value: 'the kernel is no longer running' }];
  }
  if (view.status === 'unreachable') {
    return [{ label: 'GPU view', value: 'unknown while the Jupyter server does not answer' }];
  }
  if (view.status !== 'ok') {
    const why = view.reason || view.message || view.status;
    return [{ label: 'GPU view', value: `no answer: ${why}` }];
  }
  const rows: IKernelRow[] = [];
  const hasDevice = typeof view.device === 'number';
  const source = view.device_source ? ` (${view.device_source})` : '';
  rows.push({ label: 'Device', value: hasDevice ? `cuda:${view.device}${source}` : 'none (no GPU in use)' });
  const memory = view.memory ?? [];
  if (memory.length === 0 && hasDevice) {
    rows.push({ label: 'Allocator', value: 'nothing allocated' });
  }
  for (const m of memory) {
    rows.push({
      label: `cuda:${m.ordinal}${m.framework ? ` ${m.framework}` : ''}`,
      value: `${formatBytes(m.allocated)} allocated, ${formatBytes(m.reserved)} reserved, ${formatBytes(m.peak)} peak`
    });
  }
  const warmup = warmupSummary(view);
  rows.push({ label: 'Warm-up', value: warmup.summary, ...(warmup.detail ? { detail: warmup.detail } : {}) });
  if (view.pooled) {
    rows.push({ label: 'Started', value: 'from the warm pool' });
  }
  return rows;
}

/** The warm-up state in a few words, and its detail (often long: the reason it was skipped). */
export function warmupSummary(view: IKernelView): { summary: string; detail: string | null } {
  const w = view.warmup;
  if (!w || !w.state) {
    return { summary: 'unknown', detail: null };
  }
  const where = typeof w.device === 'number' ? ` on cuda:${w.device}` : '';
  const detail = w.detail || null;
  switch (w.state) {
    case 'running':
      return { summary: `running${where}${w.phase ? ` (now: ${w.phase.replace(/_/g, ' ')})` : ''}`, detail };
    case 'done':
      return { summary: `done${where}${typeof w.total === 'number' ? ` in ${formatSeconds(w.total)}` : ''}`, detail };
    default:
      return { summary: w.state, detail };
  }
}
