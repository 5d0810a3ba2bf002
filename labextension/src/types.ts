/**
 * The JSON the gpuctx server sends: GET /gpuctx/api/devices and the messages of the
 * websocket /gpuctx/api/stream (docs/api.md). Fields the server may leave out are optional.
 */

/** A kernel's allocator on one GPU, as the kernel last reported it (bytes; seconds since the epoch). */
export interface IKernelMemory {
  /** In live tensors. */
  allocated?: number | null;
  /** Held by the allocator: allocated + cached. */
  reserved?: number | null;
  /** Reserved but not in a tensor: what "Release cache" gives back. */
  cached?: number | null;
  peak?: number | null;
  frameworks?: string[] | Record<string, unknown> | null;
  reported_at?: number | null;
}

/** The kernel of this server that a GPU process belongs to. */
export interface IKernelRef {
  id: string;
  name?: string;
  execution_state?: string | null;
  paths?: string[];
  /** Seconds since its last activity (null: unknown). */
  idle_s?: number | null;
  /** Seconds since the epoch. */
  last_activity?: number | null;
  /** Its allocator's figures for this GPU, or null when it has not reported them. */
  memory?: IKernelMemory | null;
  /** Idle longer than the server's threshold while it holds GPU memory. */
  idle_holder?: boolean;
  /** When the server will shut it down (seconds since the epoch), or null. */
  cull_at?: number | null;
  /** The server will shut it down at `cull_at`: an idle GPU holder. */
  cull_warning?: boolean;
}

/** A kernel of the warm pool, started ahead of time: no notebook's yet. */
export interface IStandbyRef {
  kernel_name?: string;
  age_s?: number | null;
}

export interface IGpuProcess {
  pid: number;
  used_memory?: number | null;
  kind?: string;
  /** Present when the process is one of this server's kernels. */
  kernel?: IKernelRef;
  /** The process name, when it is not one of this server's kernels and /proc shows it. */
  name?: string;
  /** Set when the process is a warm pool standby. */
  standby?: IStandbyRef | null;
}

/** The last out-of-memory error on a GPU (the server keeps it for 5 minutes). */
export interface IOomEvent {
  kernel_id?: string;
  paths?: string[];
  /** Seconds since the epoch. */
  time?: number;
  framework?: string | null;
  /** Bytes the failing allocation asked for, when known. */
  requested?: number | null;
}

export interface IGpuDevice {
  ordinal: number;
  nvml_index?: number;
  uuid: string;
  name: string;
  pci_bus_id?: string;
  memory_used?: number | null;
  memory_total?: number | null;
  memory_free?: number | null;
  utilization?: number | null;
  temperature?: number | null;
  power_w?: number | null;
  power_limit_w?: number | null;
  error?: string | null;
  processes?: IGpuProcess[];
  /** Bytes held on this GPU by idle holders. */
  idle_held?: number | null;
  /** The last out-of-memory error here within 5 minutes, or null. */
  oom?: IOomEvent | null;
  /** PCIe and NVLink throughput, while a GPU dashboard is open and NVML reports them. */
  links?: ILinkRates | null;
  /** The kernels suspended from this GPU: their memory of it is in host memory until they resume. */
  suspended?: ISuspendedOnDevice[];
}

/** A kernel suspended from one GPU (`devices[].suspended`). */
export interface ISuspendedOnDevice {
  kernel: Pick<IKernelRef, 'id' | 'name' | 'paths'>;
  /** Bytes of this GPU's memory it keeps in host memory. */
  bytes: number;
  /** Seconds since the epoch. */
  since?: number | null;
}

/** A suspended kernel of this server (`suspended[]`), and the answer of POST …/suspend. */
export interface ISuspended {
  kernel_id: string;
  name?: string;
  paths?: string[];
  since?: number | null;
  /** Bytes moved to host memory, per CUDA ordinal ("0"). */
  moved?: Record<string, number>;
  moved_total?: number;
  /** Seconds the suspend took; the driver's steps (lock, checkpoint) in seconds. */
  seconds?: number;
  steps?: Record<string, number>;
  /** Who asked: "api", "culling" or "pressure". */
  by?: string;
}

/** Whether this server can suspend kernels (the CUDA driver's checkpoint API), and why not. */
export interface ISuspendSupport {
  available: boolean;
  reason?: string;
  lock_timeout_s?: number;
}

/** POST …/resume: how long the restore took. */
export interface IResumeResult {
  kernel_id?: string;
  status?: string;
  seconds?: number;
  steps?: Record<string, number>;
}

/** One reading of a GPU's links, bytes/s (null: not reported, or not yet: NVLink needs two reads). */
export interface ILinkRates {
  pcie_tx?: number | null;
  pcie_rx?: number | null;
  nvlink_tx?: number | null;
  nvlink_rx?: number | null;
  /** Active NVLinks (0: none). */
  nvlink_links?: number;
  /** When they were read, seconds since the epoch. */
  time?: number | null;
}

/** Host memory and CPU of one kernel: its process and every process it started. */
export interface IKernelUsage {
  /** Bytes (RSS of the process tree). */
  memory?: number | null;
  /** Percent of one core (250: two and a half cores busy). */
  cpu_percent?: number | null;
  processes?: number;
}

/** The host the server runs on, and each of its kernels' share (usage.py). */
export interface IHostUsage {
  cpu_percent?: number | null;
  cpu_count?: number | null;
  memory_used?: number | null;
  memory_total?: number | null;
  /** When these were read, seconds since the epoch. */
  time?: number | null;
  /** Seconds between readings. */
  interval?: number | null;
  /** Kernel id -> its usage. */
  kernels?: Record<string, IKernelUsage>;
  /** Why there are no figures (no psutil where the server runs). */
  reason?: string | null;
}

/** One automatic release or cull, as the server recalls it (fields may be missing). */
export interface IHolderEvent {
  kernel_id?: string;
  paths?: string[];
  bytes?: number | null;
  released_total?: number | null;
  time?: number;
  [key: string]: unknown;
}

/** The server's idle-holder settings and what it did lately. */
export interface IHolders {
  idle_holder_seconds?: number | null;
  release_below_free_fraction?: number | null;
  release_idle_seconds?: number | null;
  cull_after_s?: number | null;
  cull_warning_s?: number | null;
  released?: IHolderEvent[];
  culled?: IHolderEvent[];
  /** Suspended kernels that resumed lately (by a cell, or by hand). */
  resumed?: IHolderEvent[];
}

/**
 * The one identity of a GPU across snapshots, used by the panel's cards, the history, the
 * charts and the status bar alike: its UUID, or `cuda:<ordinal>` where NVML gave none (a
 * replayed trace may lack it). CUDA ordinals can be renumbered by `CUDA_VISIBLE_DEVICES`; a
 * UUID cannot, so history never jumps from one board to another.
 */
export function deviceKey(device: Pick<IGpuDevice, 'uuid' | 'ordinal'>): string {
  return device.uuid || `cuda:${device.ordinal}`;
}

/** A recorded trace played back by the server: never live data. */
export interface IReplay {
  source?: string;
  recorded?: string;
}

/** One kernelspec of the warm pool: how many standbys it has, and why none when it has none. */
export interface IPoolKernelspec {
  ready?: number;
  starting?: number;
  /** Failed starts in a row. */
  failures?: number;
  /** The last failure, while starting standbys fails. */
  error?: string | null;
  /** Why it has no standby ready, in a sentence; null when it has one. */
  reason?: string | null;
  /** Automatic reserve: the running GPU notebooks that keep this kernelspec's reserve. */
  wanted_for?: string[] | null;
}

/** A standby of the warm pool: a kernel started (and warmed) before any notebook asked for it. */
export interface IPoolStandby {
  kernel_name?: string;
  /**
   * "imports": started with the server, its imports done, no CUDA context; "gpu": the GPU-warm
   * reserve, CUDA started and warmed with a notebook's plan.
   */
  kind?: 'imports' | 'gpu' | string;
  pid?: number;
  /** Started and warmed: a notebook can take it now. */
  ready?: boolean;
  /** "booting", "paused" (while a cell runs), "ready" or "stopping". */
  state?: string;
  /** Its resident host memory, bytes (with its helper processes'), or null when unread. */
  rss?: number | null;
  /** Seconds since it was started. */
  age?: number | null;
  /** The CUDA ordinal it warmed on, or null (no GPU, or unknown). */
  ordinal?: number | null;
  /** The notebook whose warm plan it ran, or null. */
  notebook?: string | null;
  /** Bytes of GPU memory it holds (NVML), or null. */
  memory?: number | null;
}

/** The host memory the standbys hold together, and the budget they share (bytes). */
export interface IPoolHostMemory {
  standbys?: number;
  /** `standby_memory_fraction` of what is available plus what the standbys hold. */
  budget?: number;
  /** What is available to the server; null when /proc cannot say. */
  available?: number | null;
  /** What bounds what is available: "machine" (MemAvailable) or "cgroup" (the container's limit). */
  limit?: 'machine' | 'cgroup' | string | null;
}

/**
 * The server's warm kernel pool ("warm reserve"), or `{error}` when reading it failed. Older
 * servers send no `mode`, `reason`, nor the standbys' `ordinal`, `notebook` and `memory`, nor
 * their `kind`, `state`, `rss` and the `host_memory` budget.
 */
export interface IPoolStatus {
  /** "auto": the automatic reserve; "fixed": `pool_size` set explicitly. */
  mode?: 'auto' | 'fixed' | string;
  /** Standbys wanted in all (auto) or per kernelspec (fixed). */
  target?: number;
  kernelspecs?: Record<string, IPoolKernelspec>;
  standbys?: IPoolStandby[];
  /** Why recent requests could not take a standby. */
  refused?: string[];
  /** Automatic reserve without any standby: why, in a sentence. */
  reason?: string | null;
  host_memory?: IPoolHostMemory | null;
  /** Set instead of the rest when the server could not read the pool's status. */
  error?: string;
}

export interface ISnapshot {
  type?: 'snapshot';
  gpu: boolean;
  reason: string | null;
  /** Seconds since the epoch, when the sample was taken. */
  time: number;
  devices: IGpuDevice[];
  hidden?: Omit<IGpuDevice, 'ordinal' | 'processes'>[];
  notes?: string[];
  replay?: IReplay | null;
  holders?: IHolders | null;
  /** The warm kernel pool; null when the server keeps none. */
  pool?: IPoolStatus | null;
  /** Host memory and CPU, the host's and each kernel's; absent before the server's first reading. */
  host?: IHostUsage | null;
  /** While a dashboard asks for link throughput: how often it is read, and why there is none. */
  links_status?: { interval?: number; reason?: string | null } | null;
  /** Suspend: offered here or not (older servers send neither of these). */
  suspend?: ISuspendSupport | null;
  suspended?: ISuspended[];
}

/** Columns of rows over time: "t" (seconds since the epoch), then one list per field (null: no value). */
export interface IHistoryColumns {
  t: number[];
  [field: string]: (number | null)[] | Record<string, (number | null)[]> | undefined;
}

/**
 * The stream's second message (and GET /gpuctx/api/history): the last `seconds` of every GPU,
 * its links and the host. A row whose values are all null is a gap: nothing was sampled then.
 */
export interface IHistoryMessage {
  type: 'history';
  time: number;
  seconds: number;
  /** What the server keeps. */
  keeps?: number;
  fine_step?: number;
  coarse_step?: number;
  /** GPU key (UUID) -> utilization, memory_used, memory_total, temperature, power_w, kernels. */
  gpus: Record<string, IHistoryColumns>;
  /** GPU key -> pcie_tx, pcie_rx, nvlink_tx, nvlink_rx. */
  links?: Record<string, IHistoryColumns>;
  host?: IHistoryColumns;
  /** Kernel id -> what the charts call it ("train.ipynb"). */
  labels?: Record<string, string>;
}

/** The stream's first message: the interval the server granted, and the history it sends next. */
export interface IHello {
  type: 'hello';
  interval: number;
  requested?: number;
  note?: string;
  history?: { seconds: number; keeps: number };
}

export interface IAllocatorMemory {
  ordinal: number;
  framework?: string;
  allocated: number;
  reserved: number;
  peak: number;
}

export interface IWarmup {
  state: string;
  detail?: string;
  source?: string;
  device?: number | null;
  phase?: string;
  phases?: Record<string, number>;
  total?: number | null;
  first_cell_overlap?: number | null;
}

/** GET /gpuctx/api/kernels/<id>: the kernel's own answer, or why there is none. */
export interface IKernelView {
  kernel_id?: string;
  /**
   * The server's word, or one the frontend sets itself: `gone` (the server answered 404: the
   * kernel was shut down), `refused` (403: this page may not read it) and `unreachable` (the
   * server did not answer at all).
   */
  status: 'ok' | 'no-answer' | 'dead' | 'error' | 'gone' | 'refused' | 'unreachable' | string;
  reason?: string;
  message?: string;
  pid?: number;
  device?: number | null;
  device_source?: string;
  default_device?: string | null;
  cuda_started?: string[];
  memory?: IAllocatorMemory[];
  warmup?: IWarmup;
  cuda_visible_devices?: string | null;
  /** Handed out by the server's warm kernel pool (started and warmed before it was asked for). */
  pooled?: boolean;
  /** Present while the kernel is not simply running: suspending, suspended or resuming. */
  suspend?: {
    state: string;
    since?: number | null;
    moved?: Record<string, number>;
    /** Why its last resume failed (it stays suspended, its variables safe). */
    error?: string | null;
  } | null;
}

/** The kernel actions of `POST /gpuctx/api/kernels/<id>/<action>` (see actions.ts for their wording). */
export type KernelAction = 'interrupt' | 'release' | 'suspend' | 'resume' | 'restart' | 'shutdown';

/** `POST /gpuctx/api/kernels/<id>/release`: what went back (HTTP 200 whatever the status). */
export interface IReleaseResult {
  kernel_id?: string;
  status: 'ok' | 'no-answer' | 'dead' | 'error' | string;
  reason?: string;
  /** Bytes per framework. */
  released?: Record<string, number>;
  released_total?: number;
  gc_collected?: number;
  cleared?: unknown;
  before?: unknown;
  after?: unknown;
  seconds?: number;
  /** The kernel uses no GPU: nothing to release. */
  /** Why nothing could go back to a GPU (the kernel's words), when that is so. */
  no_gpu?: string | null;
  output_cache?: unknown;
  round_trip_s?: number;
}
