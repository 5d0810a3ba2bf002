/**
 * The JSON the gpuctx server sends: GET /gpuctx/api/devices and the messages of the
 * websocket /gpuctx/api/stream (docs/api.md). Fields the server may leave out are optional.
 */

/** The kernel of this server that a GPU process belongs to. */
export interface IKernelRef {
  id: string;
  name?: string;
  execution_state?: string | null;
  paths?: string[];
}

export interface IGpuProcess {
  pid: number;
  used_memory?: number | null;
  kind?: string;
  /** Present when the process is one of this server's kernels. */
  kernel?: IKernelRef;
  /** The process name, when it is not one of this server's kernels and /proc shows it. */
  name?: string;
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
}

/** The stream's first message: the interval the server granted. */
export interface IHello {
  type: 'hello';
  interval: number;
  requested?: number;
  note?: string;
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
   * kernel was shut down) and `unreachable` (the server did not answer at all).
   */
  status: 'ok' | 'no-answer' | 'dead' | 'error' | 'gone' | 'unreachable' | string;
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
}

/** The kernel actions of `POST /gpuctx/api/kernels/<id>/<action>` (see actions.ts for their wording). */
export type KernelAction = 'interrupt' | 'restart' | 'shutdown';
