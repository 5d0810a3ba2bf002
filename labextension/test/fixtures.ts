import { ISnapshot } from '../src/types';

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
            kernel: { id: 'k-123456789', name: 'python3', execution_state: 'busy', paths: ['work/train.ipynb'] }
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
        ]
      }
    ]
  };
}
