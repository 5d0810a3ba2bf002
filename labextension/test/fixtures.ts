import { IPoolStatus, ISnapshot } from '../src/types';

export const GIB = 1024 ** 3;

export const NO_GPU: ISnapshot = {
  gpu: false,
  reason: 'NVML reports: libnvidia-ml.so.1 not found',
  time: 100,
  devices: [],
  hidden: [],
  notes: []
};

export function twoGpus(time = 100): ISnapshot {
  return {
    gpu: true,
    reason: null,
    time,
    devices: [
      {
        ordinal: 0,
        nvml_index: 1,
        uuid: 'GPU-aaaa',
        name: 'NVIDIA H200',
        memory_used: 12.1 * GIB,
        memory_total: 140.4 * GIB,
        memory_free: 128.3 * GIB,
        utilization: 37,
        temperature: 29,
        power_w: 120.2,
        power_limit_w: 700,
        error: null,
        processes: [
          {
            pid: 4242,
            used_memory: 630 * 1024 ** 2,
            kind: 'compute',
            kernel: {
              id: 'k-123456789',
              name: 'python3',
              execution_state: 'busy',
              paths: ['work/train.ipynb'],
              idle_s: 0,
              last_activity: time,
              memory: null,
              idle_holder: false,
              cull_at: null,
              cull_warning: false
            }
          },
          { pid: 77, used_memory: GIB, kind: 'compute', name: 'python' }
        ]
      },
      {
        ordinal: 1,
        nvml_index: 0,
        uuid: 'GPU-bbbb',
        name: 'NVIDIA H200',
        memory_used: 0.5 * GIB,
        memory_total: 140.4 * GIB,
        memory_free: 139.9 * GIB,
        utilization: 0,
        temperature: 31,
        power_w: 80,
        power_limit_w: 700,
        error: null,
        processes: [
          { pid: 5000, used_memory: GIB, kernel: { id: 'k-other', name: 'python3', execution_state: 'idle', paths: [] } }
        ],
        idle_held: 0,
        oom: null
      }
    ],
    holders: HOLDER_SETTINGS
  };
}

export const HOLDER_SETTINGS = {
  idle_holder_seconds: 1800,
  release_below_free_fraction: 0.1,
  release_idle_seconds: 600,
  cull_after_s: 7200,
  cull_warning_s: 600,
  released: [],
  culled: []
};

/** Local time today, in seconds since the epoch (the clock text depends on the time zone). */
export function at(hours: number, minutes: number, seconds = 0): number {
  return new Date(2025, 0, 1, hours, minutes, seconds).getTime() / 1000;
}

/**
 * One GPU nearly full: train.ipynb (busy) just ran out of memory; old.ipynb has been idle for
 * 2 h 01 min holding 61 GiB (60 GiB in tensors, 0.6 GiB cached) and is to be culled at 14:10;
 * a warm pool standby and a process of another user hold the rest.
 */
export function holdersSnapshot(time = at(14, 0)): ISnapshot {
  return {
    gpu: true,
    reason: null,
    time,
    devices: [
      {
        ordinal: 0,
        nvml_index: 0,
        uuid: 'GPU-cccc',
        name: 'NVIDIA H200',
        memory_used: 139 * GIB,
        memory_total: 140.4 * GIB,
        memory_free: 1.4 * GIB,
        utilization: 90,
        temperature: 50,
        power_w: 500,
        power_limit_w: 700,
        error: null,
        processes: [
          {
            pid: 4242,
            used_memory: 2 * GIB,
            kind: 'compute',
            kernel: {
              id: 'k-train',
              name: 'python3',
              execution_state: 'busy',
              paths: ['work/train.ipynb'],
              idle_s: 0,
              last_activity: time,
              memory: { allocated: 1.5 * GIB, reserved: 1.75 * GIB, cached: 0.25 * GIB, peak: 1.9 * GIB, frameworks: ['torch'], reported_at: time },
              idle_holder: false,
              cull_at: null,
              cull_warning: false
            }
          },
          { pid: 900, used_memory: 0.5 * GIB, kind: 'compute', standby: { kernel_name: 'python3', age_s: 42 } },
          {
            pid: 5151,
            used_memory: 61 * GIB,
            kind: 'compute',
            kernel: {
              id: 'k-idle',
              name: 'python3',
              execution_state: 'idle',
              paths: ['old.ipynb'],
              idle_s: 7260,
              last_activity: time - 7260,
              memory: { allocated: 60 * GIB, reserved: 60.6 * GIB, cached: 0.6 * GIB, peak: 61 * GIB, frameworks: ['torch'], reported_at: time - 7260 },
              idle_holder: true,
              cull_at: at(14, 10),
              cull_warning: true
            }
          },
          { pid: 77, used_memory: 70 * GIB, kind: 'compute', name: 'python' },
          {
            pid: 6000,
            used_memory: 3 * GIB,
            kernel: { id: 'k-quiet', name: 'python3', execution_state: 'idle', paths: ['quiet.ipynb'], idle_s: 65, memory: null }
          }
        ],
        idle_held: 61 * GIB,
        oom: { kernel_id: 'k-train', paths: ['work/train.ipynb'], time: at(13, 58, 7), framework: 'torch', requested: 4 * GIB }
      }
    ],
    holders: {
      ...HOLDER_SETTINGS,
      released: [{ kernel_id: 'k-gone', paths: ['a.ipynb'], released_total: GIB, time: time - 100 }],
      culled: [{ kernel_id: 'k-older', paths: ['b.ipynb'], bytes: 3 * GIB, time: time - 200 }]
    }
  };
}

/**
 * The automatic warm reserve holding one ready GPU-ready python3 standby, warmed on GPU 0 for
 * train.ipynb (630 MiB there, 1.76 GiB resident on the host), within a 4.80 GiB budget of the
 * machine's host memory.
 */
export function readyPool(): IPoolStatus {
  return {
    mode: 'auto',
    target: 1,
    kernelspecs: {
      python3: { ready: 1, starting: 0, failures: 0, error: null, reason: null, wanted_for: ['work/train.ipynb'] }
    },
    standbys: [
      {
        kernel_name: 'python3',
        kind: 'gpu',
        pid: 81300,
        ready: true,
        state: 'ready',
        age: 42.5,
        ordinal: 0,
        notebook: 'work/train.ipynb',
        memory: 630 * 1024 ** 2,
        rss: 1893412864
      }
    ],
    refused: [],
    reason: null,
    host_memory: { standbys: 1893412864, budget: 5153960755, available: 23264477184, limit: 'machine' }
  };
}

/** The automatic reserve with nothing in it: no GPU notebook runs. */
export const EMPTY_POOL: IPoolStatus = {
  mode: 'auto',
  target: 1,
  kernelspecs: {
    python3: { ready: 0, starting: 0, failures: 0, error: null, reason: 'no GPU notebook is running', wanted_for: [] }
  },
  standbys: [],
  refused: [],
  reason: 'no GPU notebook is running: the reserve starts once one runs'
};
