/**
 * Snapshot → what the panel and the status bar show. Plain data in, plain data out, so that
 * every rule here (naming processes, which GPU a notebook uses, the memory warning, the replay
 * mark) is tested without a browser.
 */
import { KERNEL_ACTIONS, offered } from './actions';
import {
  basename,
  formatBytes,
  formatBytesShort,
  formatClock,
  formatDuration,
  formatMemory,
  formatMemoryShort,
  formatPercent,
  formatPower,
  formatSeconds,
  formatTemperature,
  memoryFraction
} from './format';
import {
  deviceKey,
  IGpuDevice,
  IGpuProcess,
  IHolderEvent,
  IHolders,
  IKernelRef,
  IKernelUsage,
  IKernelView,
  IPoolStandby,
  IPoolStatus,
  ISnapshot,
  ISuspended,
  KernelAction
} from './types';

export const REPLAY_BANNER = 'Replay of a recorded trace — not live data';

/** Shown while the server does not answer (instead of the browser's "Failed to fetch"). */
export const OUTAGE_TEXT = 'Lost contact with the Jupyter server; retrying…';

/** A 403: the server answers, but refuses this page; retrying changes nothing, the user can. */
export const REFUSED_TEXT =
  "The Jupyter server refused access (403): this page's login may have expired, or this account may not " +
  'do this. Log in again if asked, then reload the page.';

const CLICK = 'Click to open the GPU panel (Ctrl-click or ⌘-click: the GPU dashboard).';

/** Where the data comes from, and whether it is fresh: one state, said once in each view. */
export type ConnectionKind = 'connecting' | 'live' | 'replay' | 'stale' | 'offline' | 'refused';

export interface IConnectionInput {
  /** The server refused this page (403): not retried, unlike an outage. */
  refused?: boolean;
  /** The stream is retrying: the server closed or refused the connection, or does not answer. */
  offline: boolean;
  /** Seconds since the last snapshot, once that is older than two stream intervals; else null. */
  staleFor: number | null;
  /** When the last snapshot arrived, ms since the epoch. */
  lastUpdate: number | null;
  /** Some snapshot has arrived. */
  hasData: boolean;
  /** The snapshots replay a recorded trace. */
  replay: IReplayView | null;
}

export interface IConnectionView {
  kind: ConnectionKind;
  /** The one line the panel's header and the dashboard show. */
  text: string;
  /** The same without the running count ("for 12 s"), for screen readers: said once per change. */
  spoken: string;
  /** What the status bar adds in brackets: "replay", "stale 12 s", "offline"; empty when live. */
  badge: string;
  /** The replayed trace's file and recording date, shown under the line. */
  detail: string | null;
  /** The server does not answer now: kernel actions are not offered. */
  down: boolean;
}

/** The state of the data in words: live, replay, stale for N s, offline, refused, or connecting. */
export function connectionView(input: IConnectionInput): IConnectionView {
  const replay = input.replay;
  const detail = replay ? `${replay.name}${replay.recorded ? `, recorded ${replay.recorded}` : ''}` : null;
  const since = input.lastUpdate !== null ? formatClock(input.lastUpdate) : null;
  const ofReplay = replay ? ' (a replay of a recorded trace)' : '';
  const badge = (state: string) => (replay ? `replay, ${state}` : state);
  if (input.refused) {
    const text = `Access refused: ${REFUSED_TEXT}${since ? ` Last update ${since}.` : ''}${ofReplay}`;
    return { kind: 'refused', text, spoken: text, badge: badge('access refused'), detail, down: true };
  }
  if (input.offline) {
    const text = `Offline: lost contact with the Jupyter server; retrying…${since ? ` Last update ${since}.` : ''}${ofReplay}`;
    return { kind: 'offline', text, spoken: text, badge: badge('offline'), detail, down: true };
  }
  if (input.staleFor !== null && input.hasData) {
    const age = formatDuration(input.staleFor);
    const rest = `no data from the server since ${since ?? 'the last update'}${ofReplay}`;
    return {
      kind: 'stale',
      text: `Stale for ${age}: ${rest}`,
      spoken: `Stale: ${rest}`,
      badge: badge(`stale ${age}`),
      detail,
      down: true
    };
  }
  if (!input.hasData) {
    const text = 'Connecting to the gpuctx server…';
    return { kind: 'connecting', text, spoken: text, badge: '', detail: null, down: false };
  }
  if (replay) {
    return { kind: 'replay', text: REPLAY_BANNER, spoken: REPLAY_BANNER, badge: 'replay', detail, down: false };
  }
  return { kind: 'live', text: 'Live', spoken: 'Live', badge: '', detail: null, down: false };
}

/** "1.20 GiB memory, 37% CPU": a kernel's host usage (its process tree); null when unknown. */
export function hostUsageText(usage: IKernelUsage | null | undefined): string | null {
  if (!usage) {
    return null;
  }
  const memory = num(usage.memory);
  const cpu = num(usage.cpu_percent);
  const parts = [memory !== null ? `${formatBytes(memory)} memory` : null, cpu !== null ? `${formatPercent(cpu)} CPU` : null];
  const text = parts.filter(Boolean).join(', ');
  if (!text) {
    return null;
  }
  const count = num(usage.processes);
  return count !== null && count > 1 ? `${text} (${count} processes)` : text;
}

export const STANDBY_LABEL = 'warm pool standby';
export const IDLE_HOLDER_TEXT = 'idle holder';

export interface IProcessView {
  pid: number;
  /** What a person recognises: the notebook, else the kernel or process name, else the PID. */
  label: string;
  /** Longer text for the tooltip / screen readers. */
  description: string;
  memory: string;
  /** NVML's figure in bytes (null: unknown): the order of holders. */
  usedMemory: number | null;
  /** Set when the process is one of this server's kernels: the actions apply to it. */
  kernelId: string | null;
  executionState: string | null;
  /** A warm pool standby: no notebook's yet, no actions. */
  standby: boolean;
  /** "idle 2 h 01 min", for this server's kernels that are not busy; null otherwise. */
  idleText: string | null;
  /** The kernel's allocator: "60.0 GiB in tensors, 614 MiB cached"; null when not reported. */
  allocatorText: string | null;
  /** Host memory and CPU of the kernel's processes: "1.20 GiB memory, 37% CPU"; null when unknown. */
  hostText: string | null;
  /** Idle longer than the server's threshold while holding GPU memory. */
  idleHolder: boolean;
  /** The server will shut the kernel down at `cullText`'s time unless it runs a cell. */
  cullWarning: boolean;
  /** "shut down at 14:05 unless used"; null without a warning. */
  cullText: string | null;
  /** Worth a "Release cache" button: it holds cached memory, or is an idle holder. */
  canRelease: boolean;
  /** Worth a "Suspend" button: the server can suspend kernels, and this one is not busy. */
  canSuspend: boolean;
  /** On a GPU with a recent out-of-memory error: the kernel that failed, or a holder there. */
  oom: 'failing' | 'holder' | null;
}

/** A recent out-of-memory error on a GPU, in words. */
export interface IOomView {
  kernelId: string | null;
  /** "train.ipynb". */
  label: string;
  /** "train.ipynb ran out of memory here 14:03:21". */
  text: string;
  /** "torch asked for 2.00 GiB. Held here, largest first: a.ipynb 60.0 GiB (idle holder, idle 2 h 01 min), …". */
  detail: string;
}

/** A kernel suspended from a GPU, in words. */
export interface ISuspendedView {
  kernelId: string;
  /** "train.ipynb". */
  label: string;
  /** "suspended: 60.0 GiB in host memory since 14:02". */
  text: string;
  description: string;
}

export interface IDeviceView {
  key: string;
  ordinal: number;
  /** "cuda:0 · NVIDIA H200". */
  title: string;
  /** "cuda:0": the compact row's name. */
  shortName: string;
  /** "H200": the board's name without its maker, beside the compact row's name. */
  model: string;
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
  /** "5.70 GiB". */
  memoryUsedText: string;
  /** "5.70 / 140 GiB": the compact row's figure. */
  memoryShortText: string;
  /** Memory use is at or above the warning threshold. */
  memoryWarn: boolean;
  temperatureText: string;
  powerText: string;
  /** In the server's order; largest first while `oom` is set. */
  processes: IProcessView[];
  /** The process holding most memory, preferring notebooks: the compact row names it. */
  top: IProcessView | null;
  /** "60.0 GiB": memory held here by idle holders; null when none. */
  idleHeldText: string | null;
  /** The last out-of-memory error here (within the server's 5 minutes), or null. */
  oom: IOomView | null;
  /** The kernels suspended from this GPU (not among `processes`: NVML no longer lists them). */
  suspended: ISuspendedView[];
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
  /** What the server took back from idle notebooks lately, newest first, in sentences. */
  reclaimed: string[];
  /** The warm reserve (the server's pool of standby kernels); null when the server keeps none. */
  reserve: IReserveView | null;
}

/** The warm reserve in words: a headline, then one line per standby and why it is empty or failing. */
export interface IReserveView {
  /** "Warm reserve: 1 kernel ready", "Warm reserve: starting", "Warm reserve: empty". */
  headline: string;
  lines: string[];
  /** 'warn' while standbys fail to start (a line says so in words too). */
  tone: 'normal' | 'warn';
}

export function isReplay(snapshot: ISnapshot | null | undefined): boolean {
  return !!snapshot && !!snapshot.replay;
}

/** The memory warning as a fraction 0..1 of a GPU's total, from the setting in percent. */
export function warnFraction(percent: number): number {
  return Math.min(1, Math.max(0, percent / 100));
}

/** The notebook(s) of a kernel by file name, else "python3 kernel 1a2b3c4d". */
export function kernelLabel(kernel: Pick<IKernelRef, 'id' | 'name' | 'paths'>): string {
  const paths = kernel.paths ?? [];
  return paths.length ? paths.map(basename).join(', ') : `${kernel.name || 'kernel'} kernel ${kernel.id.slice(0, 8)}`;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** The bytes a kernel's allocator holds but no tensor uses (reserved − allocated when not given). */
export function cachedBytes(kernel: IKernelRef | undefined): number | null {
  const m = kernel?.memory;
  if (!m) {
    return null;
  }
  const cached = num(m.cached);
  if (cached !== null) {
    return cached;
  }
  const reserved = num(m.reserved);
  const allocated = num(m.allocated);
  return reserved !== null && allocated !== null ? Math.max(0, reserved - allocated) : null;
}

/** "60.0 GiB in tensors, 614 MiB cached", from the kernel's allocator; null when it has not said. */
export function allocatorText(kernel: IKernelRef | undefined): string | null {
  const m = kernel?.memory;
  if (!m) {
    return null;
  }
  const allocated = num(m.allocated);
  const cached = cachedBytes(kernel);
  const parts: string[] = [];
  if (allocated !== null) {
    parts.push(`${formatBytes(allocated)} in tensors`);
  }
  if (cached !== null) {
    parts.push(`${formatBytes(cached)} cached`);
  }
  return parts.length ? parts.join(', ') : null;
}

/** Context a process row needs from its GPU. */
export interface IProcessContext {
  /** The kernel whose out-of-memory error is recent on this GPU; undefined: none. */
  oomKernel?: string | null;
  /** Host usage per kernel id (the snapshot's `host.kernels`). */
  usage?: Record<string, IKernelUsage>;
  /** The server can suspend kernels (its snapshot's `suspend.available`). */
  suspend?: boolean;
}

/** How a suspended notebook is named everywhere: "suspended: 60.0 GiB in host memory since 14:02". */
export function suspendedText(bytes: number | null | undefined, since: number | null | undefined): string {
  const when = num(since) !== null ? ` since ${formatClock(since! * 1000, false)}` : '';
  return `suspended: ${formatBytes(bytes)} in host memory${when}`;
}

/**
 * Whether the notebook section offers Suspend (the server can, the kernel is idle and holds GPU
 * memory) or Resume (the server lists it as suspended, or the kernel says it is).
 */
export function notebookOffer(
  snapshot: ISnapshot | null,
  view: IKernelView | null,
  kernelId: string,
  status: string | null
): { suspendable: boolean; suspended: boolean } {
  const state = view?.suspend?.state;
  const suspended = !!suspendedKernel(snapshot, kernelId) || state === 'suspended' || state === 'suspending';
  const holds = (snapshot?.devices ?? []).some(d => (d.processes ?? []).some(p => p.kernel?.id === kernelId));
  return { suspendable: !!snapshot?.suspend?.available && status === 'idle' && holds, suspended };
}

/** The server's entry for a suspended kernel, or null when it is not suspended. */
export function suspendedKernel(snapshot: ISnapshot | null | undefined, kernelId: string | null): ISuspended | null {
  const all = Array.isArray(snapshot?.suspended) ? snapshot!.suspended : [];
  return (kernelId && all.find(s => s && s.kernel_id === kernelId)) || null;
}

export function describeProcess(p: IGpuProcess, context: IProcessContext = {}): IProcessView {
  const memory = formatBytes(p.used_memory);
  const usedMemory = num(p.used_memory);
  const kernel = p.kernel;
  const plain = {
    pid: p.pid,
    memory,
    usedMemory,
    standby: false,
    idleText: null,
    allocatorText: null,
    hostText: null,
    idleHolder: false,
    cullWarning: false,
    cullText: null,
    canRelease: false,
    canSuspend: false,
    oom: context.oomKernel !== undefined ? ('holder' as const) : null
  };
  if (p.standby) {
    const name = p.standby.kernel_name || kernel?.name || 'kernel';
    const age = num(p.standby.age_s);
    return {
      ...plain,
      label: `${STANDBY_LABEL} (${name})`,
      description:
        `A ${STANDBY_LABEL}: a ${name} kernel started ahead of time, so that the next notebook starts at once` +
        `${age !== null ? `; started ${formatDuration(age)} ago` : ''} (PID ${p.pid})`,
      kernelId: null,
      executionState: null,
      standby: true
    };
  }
  if (kernel) {
    const paths = kernel.paths ?? [];
    const kernelName = kernel.name || 'kernel';
    const label = kernelLabel(kernel);
    const state = kernel.execution_state ?? null;
    const where = paths.length ? paths.join(', ') : 'no notebook';
    const idle = num(kernel.idle_s);
    const idleText = idle !== null && state !== 'busy' ? `idle ${formatDuration(idle)}` : null;
    const allocator = allocatorText(kernel);
    const idleHolder = !!kernel.idle_holder;
    const cullAt = num(kernel.cull_at);
    const cullWarning = !!kernel.cull_warning && cullAt !== null;
    const cullText = cullWarning ? `shut down at ${formatClock(cullAt! * 1000, false)} unless used` : null;
    const cached = cachedBytes(kernel);
    const hostText = hostUsageText(context.usage?.[kernel.id]);
    const facts = [
      state,
      idleText,
      allocator && `allocator: ${allocator}`,
      hostText && `host: ${hostText}`,
      idleHolder && `${IDLE_HOLDER_TEXT}: idle while holding GPU memory`,
      cullText && `the server will ${cullText}`
    ].filter(Boolean);
    return {
      ...plain,
      label,
      description: [`${where} — ${kernelName} kernel ${kernel.id}, PID ${p.pid}`, ...facts].join(', '),
      kernelId: kernel.id,
      executionState: state,
      idleText,
      allocatorText: allocator,
      hostText,
      idleHolder,
      cullWarning,
      cullText,
      canRelease: idleHolder || (cached !== null && cached > 0),
      canSuspend: !!context.suspend && state !== 'busy' && state !== 'dead',
      oom: context.oomKernel === undefined ? null : context.oomKernel === kernel.id ? 'failing' : 'holder'
    };
  }
  const label = p.name ? `${p.name} (PID ${p.pid})` : `PID ${p.pid}`;
  return {
    ...plain,
    label,
    description: `${label}: not a kernel of this server`,
    kernelId: null,
    executionState: null
  };
}

/** Largest first (unknown last); the server's order among equals. */
function byMemory(processes: IGpuProcess[]): IGpuProcess[] {
  return [...processes].sort((a, b) => (num(b.used_memory) ?? -1) - (num(a.used_memory) ?? -1));
}

/** The out-of-memory banner of a GPU: who ran out, when, and who holds the memory there. */
export function describeOom(d: IGpuDevice, holders: IProcessView[]): IOomView | null {
  const oom = d.oom;
  if (!oom) {
    return null;
  }
  const kernelId = oom.kernel_id ?? null;
  const failing = kernelId ? holders.find(p => p.kernelId === kernelId) : undefined;
  const label = oom.paths?.length
    ? oom.paths.map(basename).join(', ')
    : failing
      ? failing.label
      : kernelId
        ? `kernel ${kernelId.slice(0, 8)}`
        : 'A notebook';
  const when = num(oom.time) !== null ? ` ${formatClock(oom.time! * 1000)}` : '';
  const asked = num(oom.requested);
  const parts: string[] = [];
  if (asked !== null) {
    parts.push(`${oom.framework ? `${oom.framework} ` : 'It '}asked for ${formatBytes(asked)} more.`);
  }
  const others = holders.filter(p => p.oom === 'holder');
  if (others.length) {
    const named = others.slice(0, 4).map(p => {
      const notes = [p.idleHolder && IDLE_HOLDER_TEXT, p.idleText].filter(Boolean);
      return `${p.label} ${p.memory}${notes.length ? ` (${notes.join(', ')})` : ''}`;
    });
    const more = others.length > 4 ? `, and ${others.length - 4} more` : '';
    parts.push(`Held here, largest first: ${named.join('; ')}${more}.`);
  } else {
    parts.push('No other process holds memory here.');
  }
  return { kernelId, label, text: `${label} ran out of memory here${when}`, detail: parts.join(' ') };
}

/** The process a compact row names: a notebook's kernel before anything else, then the most memory. */
function topProcess(processes: IGpuProcess[]): IGpuProcess | null {
  const ranked = [...processes].sort((a, b) => {
    const nb = Number(!!b.kernel?.paths?.length) - Number(!!a.kernel?.paths?.length);
    return nb !== 0 ? nb : (b.used_memory ?? 0) - (a.used_memory ?? 0);
  });
  return ranked[0] ?? null;
}

export function describeDevice(
  d: IGpuDevice,
  warnAt = warnFraction(90),
  usage?: Record<string, IKernelUsage>,
  suspend = false
): IDeviceView {
  const smi = typeof d.nvml_index === 'number' ? `nvidia-smi ${d.nvml_index}` : '';
  const fraction = memoryFraction(d.memory_used, d.memory_total);
  const processes = d.processes ?? [];
  const top = topProcess(processes);
  const context: IProcessContext = d.oom ? { oomKernel: d.oom.kernel_id ?? null, usage, suspend } : { usage, suspend };
  const views = (d.oom ? byMemory(processes) : processes).map(p => describeProcess(p, context));
  const idleHeld = num(d.idle_held);
  return {
    key: deviceKey(d),
    ordinal: d.ordinal,
    title: `cuda:${d.ordinal} · ${d.name}`,
    shortName: `cuda:${d.ordinal}`,
    model: d.name.replace(/^NVIDIA\s+/, ''),
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
    memoryShortText: formatMemoryShort(d.memory_used, d.memory_total),
    memoryWarn: fraction !== null && fraction >= warnAt,
    temperatureText: formatTemperature(d.temperature),
    powerText: formatPower(d.power_w, d.power_limit_w),
    processes: views,
    top: top ? describeProcess(top, context) : null,
    idleHeldText: idleHeld !== null && idleHeld > 0 ? formatBytes(idleHeld) : null,
    oom: describeOom(d, views),
    suspended: (Array.isArray(d.suspended) ? d.suspended : [])
      .filter(e => e && e.kernel && typeof e.kernel.id === 'string')
      .map(e => {
        const label = kernelLabel(e.kernel);
        const text = suspendedText(e.bytes, e.since);
        return {
          kernelId: e.kernel.id,
          label,
          text,
          description: `${label} is ${text} (from cuda:${d.ordinal}); it resumes on its next cell, or with Resume`
        };
      })
  };
}

export function panelView(snapshot: ISnapshot, warnAt = warnFraction(90)): IPanelView {
  const usage = snapshot.host?.kernels;
  const replay = snapshot.replay
    ? {
        source: snapshot.replay.source ?? 'unknown source',
        name: basename(snapshot.replay.source ?? 'unknown source'),
        recorded: snapshot.replay.recorded ?? ''
      }
    : null;
  const suspend = !!snapshot.suspend?.available;
  const devices = (snapshot.devices ?? []).map(d => describeDevice(d, warnAt, usage, suspend));
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
  return {
    replay,
    noGpu,
    devices,
    notes,
    reclaimed: reclaimedLines(snapshot.holders),
    reserve: reserveView(snapshot.pool)
  };
}

/** A standby's `kind` in the panel's words: what it has done ahead of time. */
const STANDBY_KINDS: Record<string, string> = { imports: 'imports', gpu: 'GPU-ready' };

/** A standby's `state` in the panel's words: "booting" is "starting", as in the headline. */
const STANDBY_STATES: Record<string, string> = { booting: 'starting' };

/**
 * "python3 · GPU-ready · GPU 0 · 630 MiB · warmed for train.ipynb · RSS 1.76 GiB · ready", or
 * "python3 · imports · RSS 584 MiB · paused": what an older server omits is left out.
 */
function standbyLine(s: IPoolStandby): string {
  const ordinal = num(s.ordinal);
  const memory = num(s.memory);
  const rss = num(s.rss);
  const state = s.state ? (STANDBY_STATES[s.state] ?? s.state) : s.ready ? 'ready' : 'starting';
  return [
    s.kernel_name || 'kernel',
    s.kind ? (STANDBY_KINDS[s.kind] ?? s.kind) : null,
    ordinal !== null ? `GPU ${ordinal}` : null,
    memory !== null ? formatBytes(memory) : null,
    s.notebook ? `warmed for ${basename(s.notebook)}` : null,
    rss !== null ? `RSS ${formatBytes(rss)}` : null,
    state
  ]
    .filter(Boolean)
    .join(' · ');
}

/**
 * "Standbys' host memory: 2.33 / 4.80 GiB budget (machine)": what they hold together of the share of
 * host memory they may hold, and what bounds it — the machine, or the container's memory limit
 * ("container"). Without a reading of what is available (no /proc), only what they hold; null
 * from an older server.
 */
function hostMemoryLine(pool: IPoolStatus): string | null {
  const m = pool.host_memory;
  const used = num(m?.standbys);
  if (!m || used === null) {
    return null;
  }
  const budget = num(m.budget);
  if (budget === null || num(m.available) === null) {
    return `Standbys' host memory: ${formatBytes(used)}`;
  }
  const basis = m.limit === 'cgroup' ? 'container' : 'machine';
  return `Standbys' host memory: ${formatMemoryShort(used, budget)} budget (${basis})`;
}

/**
 * The warm reserve (the kernels the server starts ahead of time, so that a new or restarted
 * notebook gets a warmed kernel at once), or null when the server keeps none. When it holds
 * nothing, the server's reason is the line a person needs; a failing kernelspec is said in words.
 */
export function reserveView(pool: IPoolStatus | null | undefined): IReserveView | null {
  if (!pool) {
    return null;
  }
  if (pool.error !== undefined && pool.error !== null) {
    const why = pool.error ? ` (${pool.error})` : '';
    return { headline: `Warm reserve: status unavailable${why}`, lines: [], tone: 'warn' };
  }
  const specs = Object.entries(pool.kernelspecs ?? {}).filter(([, spec]) => !!spec);
  const standbys = (Array.isArray(pool.standbys) ? pool.standbys : []).filter(Boolean);
  const ready = standbys.filter(s => s.ready).length;
  const starting = standbys.length > ready || specs.some(([, spec]) => (num(spec.starting) ?? 0) > 0);
  const headline = ready
    ? `Warm reserve: ${ready} kernel${ready === 1 ? '' : 's'} ready`
    : `Warm reserve: ${starting ? 'starting' : 'empty'}`;
  const lines = standbys.map(standbyLine);
  if (standbys.length === 0) {
    const reason = pool.reason || specs.map(([, spec]) => spec.reason).find(Boolean);
    if (reason) {
      lines.push(reason);
    }
  }
  const failing = specs.filter(([, spec]) => !!spec.error);
  for (const [name, spec] of failing) {
    // An empty kernelspec's reason already quotes its error.
    if (!lines.some(line => line.includes(spec.error!))) {
      lines.push(`${name} standbys fail to start: ${spec.error}`);
    }
  }
  if (pool.mode === 'auto' && ready) {
    const wanted = specs.flatMap(([, spec]) => (Array.isArray(spec.wanted_for) ? spec.wanted_for : []));
    const names = Array.from(new Set(wanted.filter(Boolean).map(basename)));
    if (names.length) {
      const which = names.length === 1 ? 'this notebook' : 'these notebooks';
      lines.push(`Restart of ${which} is GPU-ready: ${names.join(', ')}`);
    }
  }
  const hostMemory = standbys.length ? hostMemoryLine(pool) : null;
  if (hostMemory) {
    lines.push(hostMemory);
  }
  return { headline, lines, tone: failing.length ? 'warn' : 'normal' };
}

/**
 * The server's last automatic releases and culls, newest first: "13:58:07 Released 1.00 GiB of
 * cached memory from a.ipynb". Entries missing a field still make a sentence.
 */
export function reclaimedLines(holders: IHolders | null | undefined): string[] {
  const name = (e: IHolderEvent) =>
    e.paths?.length
      ? e.paths.map(basename).join(', ')
      : e.kernel_id
        ? `kernel ${String(e.kernel_id).slice(0, 8)}`
        : 'a notebook';
  const bytes = (e: IHolderEvent) => num(e.released_total) ?? num(e.bytes);
  const when = (e: IHolderEvent) => (num(e.time) !== null ? `${formatClock(e.time! * 1000)} ` : '');
  const events: [number, string][] = [];
  for (const e of (Array.isArray(holders?.released) ? holders!.released : []).filter(Boolean)) {
    const b = bytes(e);
    if (e.action === 'suspend') {
      const moved = b !== null ? `, moving ${formatBytes(b)} to host memory` : '';
      events.push([num(e.time) ?? 0, `${when(e)}Suspended idle ${name(e)} (the GPU ran short)${moved}`]);
      continue;
    }
    const what = b !== null ? `${formatBytes(b)} of cached memory` : 'cached memory';
    events.push([num(e.time) ?? 0, `${when(e)}Released ${what} from ${name(e)}`]);
  }
  for (const e of (Array.isArray(holders?.culled) ? holders!.culled : []).filter(Boolean)) {
    const b = bytes(e);
    const freed = b !== null ? `, freeing ${formatBytes(b)}` : '';
    const verb = e.action === 'suspend' ? 'Suspended' : 'Shut down';
    events.push([num(e.time) ?? 0, `${when(e)}${verb} idle ${name(e)}${freed}`]);
  }
  return events.sort((a, b) => b[0] - a[0]).map(([, text]) => text);
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
export type StatusState = 'waiting' | 'no-kernel' | 'no-gpu' | 'unknown' | 'none' | 'gpu' | 'suspended';

export interface IStatusInput {
  snapshot: ISnapshot | null;
  /** The active notebook's kernel, null without one. */
  kernelId: string | null;
  kernelView: IKernelView | null;
  warnPercent: number;
  /** The state of the data (connectionView): its badge ends the item's text. */
  connection: IConnectionView;
}

export interface IStatusView {
  state: StatusState;
  /** "GPU0 37% 12.1G", "GPU –", "GPU …" (without the state's badge). */
  text: string;
  /** "replay", "stale 12 s", "offline": shown after the text in brackets; empty when live. */
  badge: string;
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
  const { snapshot, kernelId, kernelView: view, connection } = input;
  const replay = isReplay(snapshot);
  const notes: string[] = [];
  if (connection.kind !== 'live' && connection.kind !== 'connecting') {
    notes.push(connection.text.endsWith('.') ? connection.text : `${connection.text}.`);
  }
  notes.push(CLICK);
  const base = { replay, warn: false, stale: connection.down, deviceKey: null, badge: connection.badge };
  const make = (state: StatusState, text: string, what: string): IStatusView => ({
    ...base,
    state,
    text,
    description: [what, ...notes].join(' ')
  });

  if (!snapshot) {
    const what = connection.kind === 'refused' ? 'GPU: no data.' : 'GPU: waiting for the gpuctx server.';
    return make('waiting', 'GPU …', what);
  }
  if (!kernelId || view?.status === 'gone') {
    return make('no-kernel', 'GPU –', 'GPU: this notebook has no running kernel, so it uses no GPU.');
  }
  if (!snapshot.gpu || (snapshot.devices ?? []).length === 0) {
    return make('no-gpu', 'GPU –', `No GPU: ${snapshot.reason || 'the server sees none'}.`);
  }
  const suspended = suspendedKernel(snapshot, kernelId);
  if (suspended) {
    const ordinals = Object.keys(suspended.moved ?? {}).sort();
    const text = suspendedText(suspended.moved_total, suspended.since);
    return make(
      'suspended',
      `GPU${ordinals[0] ?? ''} suspended`,
      `This notebook is ${text}; it resumes on its next cell (or with Resume in the GPU panel).`
    );
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

/**
 * The "this notebook" section: the kernel's own answer as label/value rows, and its host memory
 * and CPU beside its GPU memory (`usage`: the server's reading of the kernel's processes).
 */
export function kernelRows(view: IKernelView | null, usage?: IKernelUsage | null): IKernelRow[] {
  const host = hostUsageText(usage);
  const hostRow: IKernelRow[] = host ? [{ label: 'Host', value: host }] : [];
  if (!view) {
    return [{ label: 'GPU view', value: 'asking the kernel…' }, ...hostRow];
  }
  if (view.status === 'gone') {
    return [{ label: 'GPU view', value: 'the kernel is no longer running' }];
  }
  if (view.status === 'unreachable') {
    return [{ label: 'GPU view', value: 'unknown while the Jupyter server does not answer' }];
  }
  if (view.status === 'refused') {
    return [{ label: 'GPU view', value: view.reason || REFUSED_TEXT }];
  }
  if (view.status !== 'ok') {
    const why = view.reason || view.message || view.status;
    return [{ label: 'GPU view', value: `no answer: ${why}` }, ...hostRow];
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
  rows.push(...hostRow);
  const suspend = view.suspend;
  if (suspend && suspend.state && suspend.state !== 'running') {
    const moved = Object.values(suspend.moved ?? {}).reduce((a, b) => a + (num(b) ?? 0), 0);
    const value =
      suspend.state === 'suspended' ? `${suspendedText(moved, suspend.since)}; it resumes on its next cell` : suspend.state;
    rows.push({
      label: 'GPU memory',
      value,
      ...(suspend.error ? { detail: `The last resume failed: ${suspend.error}` } : {})
    });
  }
  const warmup = warmupSummary(view);
  rows.push({ label: 'Warm-up', value: warmup.summary, ...(warmup.detail ? { detail: warmup.detail } : {}) });
  if (view.pooled) {
    rows.push({ label: 'Started', value: 'from the warm pool' });
  }
  return rows;
}

/** Kernel views that are no answer of the kernel's: no action is offered on them. */
const NOT_ANSWERING = new Set(['gone', 'unreachable', 'refused']);

/** What the notebook section needs to decide which actions apply. */
export interface INotebookActionsInput {
  kernelId: string | null;
  /** JupyterLab's word for the kernel: "idle", "busy", "dead", "unknown"… */
  kernelStatus: string | null;
  view: IKernelView | null;
  snapshot: ISnapshot | null;
  /** The server does not answer now (stale or offline). */
  down: boolean;
}

/**
 * The actions the notebook section offers, in the table's order: none for a kernel that is gone
 * or dead, or that the server refuses this page (403), or while the server does not answer;
 * Release cache only where there is something to release (the kernel's allocator holds cached
 * memory, or the GPU API marks it an idle holder); Suspend where the server can and the kernel is
 * idle on a GPU, Resume (and no Release) while it is suspended (notebookOffer).
 */
export function notebookActions(input: INotebookActionsInput): KernelAction[] {
  const { kernelId, view } = input;
  if (!kernelId || input.down || (view && NOT_ANSWERING.has(view.status))) {
    return [];
  }
  if (input.kernelStatus === 'dead' || input.kernelStatus === 'unknown' || view?.status === 'dead') {
    return [];
  }
  const cached = view?.status === 'ok' && (view.memory ?? []).some(m => m.reserved > m.allocated);
  const listed = (input.snapshot?.devices ?? []).some(d =>
    (d.processes ?? []).some(p => p.kernel?.id === kernelId && describeProcess(p).canRelease)
  );
  const offer = notebookOffer(input.snapshot, view, kernelId, input.kernelStatus);
  return KERNEL_ACTIONS.filter(spec => offered(spec, { holder: cached || listed, ...offer })).map(spec => spec.action);
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
