// @vitest-environment jsdom
/**
 * The panel's DOM with GPUs (which CI machines do not have): cards, processes with their
 * buttons, the replay banner, and that a card is updated in place rather than rebuilt.
 */
import { Widget } from '@lumino/widgets';
import { describe, expect, it } from 'vitest';

import { DeviceHistory } from '../src/history';
import { GpuPanel, IActionRequest } from '../src/panel';
import { NO_GPU, twoGpus } from './fixtures';

function mounted(): GpuPanel {
  const panel = new GpuPanel(new DeviceHistory(120, 1));
  Widget.attach(panel, document.body);
  return panel;
}

describe('GpuPanel', () => {
  it('renders one card per GPU with its processes and their kernel actions', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    const cards = panel.node.querySelectorAll('.jp-gpuctx-card');
    expect(cards).toHaveLength(2);
    const first = cards[0] as HTMLElement;
    const heading = first.querySelector('h3')!;
    expect(heading.textContent).toBe('cuda:0 · NVIDIA H200');
    expect(first.getAttribute('aria-labelledby')).toBe(heading.id);
    expect(first.querySelector('.jp-gpuctx-meter-utilization .jp-gpuctx-meter-value')!.textContent).toBe('37%');
    expect(first.querySelector('[role="meter"]')!.getAttribute('aria-valuenow')).toBe('37');
    expect(first.querySelector('.jp-gpuctx-sparkline')!.getAttribute('aria-label')).toContain('over the last 2 min');
    const labels = Array.from(first.querySelectorAll('.jp-gpuctx-process-label')).map(n => n.textContent);
    expect(labels).toEqual(['train.ipynb', 'python (PID 77)']);
    const buttons = Array.from(first.querySelectorAll('button')) as HTMLButtonElement[];
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

  it('updates cards in place, so a focused button keeps focus', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus(100));
    const button = panel.node.querySelector('.jp-gpuctx-card button') as HTMLButtonElement;
    button.focus();
    const next = twoGpus(101);
    next.devices[0].utilization = 80;
    next.devices[0].processes![0].used_memory = 2 * 1024 ** 3;
    panel.setSnapshot(next);
    expect(document.activeElement).toBe(button);
    const card = panel.node.querySelector('.jp-gpuctx-card')!;
    expect(card.querySelector('.jp-gpuctx-meter-value')!.textContent).toBe('80%');
    expect(card.querySelector('.jp-gpuctx-process-memory')!.textContent).toBe('2.0 GiB');
    Widget.detach(panel);
  });

  it('says why there is no GPU, and drops the cards', () => {
    const panel = mounted();
    panel.setSnapshot(twoGpus());
    panel.setSnapshot({ ...NO_GPU, time: 200 });
    expect(panel.node.querySelectorAll('.jp-gpuctx-card')).toHaveLength(0);
    const note = panel.node.querySelector('.jp-gpuctx-nogpu') as HTMLElement;
    expect(note.hidden).toBe(false);
    expect(note.textContent).toBe('No GPU: NVML reports: libnvidia-ml.so.1 not found');
    Widget.detach(panel);
  });

  it('shows a replay banner whenever the data is a recorded trace', () => {
    const panel = mounted();
    panel.setSnapshot({ ...twoGpus(), replay: { source: 'h200-trace.jsonl', recorded: '2025-06-01' } });
    const banner = panel.node.querySelector('.jp-gpuctx-replay') as HTMLElement;
    expect(banner.hidden).toBe(false);
    expect(banner.getAttribute('role')).toBe('alert');
    expect(banner.textContent).toContain('Replay of a recorded trace — not live data');
    expect(banner.textContent).toContain('h200-trace.jsonl, recorded 2025-06-01');
    panel.setSnapshot(twoGpus(300));
    expect(banner.hidden).toBe(true);
    Widget.detach(panel);
  });

  it("shows the active notebook's kernel with its actions", () => {
    const panel = mounted();
    panel.setNotebook(
      { name: 'a.ipynb', path: 'x/a.ipynb', kernelId: 'k1', kernelName: 'Python 3', kernelStatus: 'busy' },
      { status: 'ok', device: 0, device_source: "CUDA's default", memory: [], warmup: { state: 'done', total: 0.5 } }
    );
    const section = panel.node.querySelector('.jp-gpuctx-notebook')!;
    expect(section.querySelector('.jp-gpuctx-notebook-name')!.textContent).toBe('a.ipynb (Python 3, busy)');
    expect(section.querySelector('dl')!.textContent).toContain("cuda:0 (CUDA's default)");
    expect(section.querySelectorAll('button')).toHaveLength(3);
    panel.setNotebook(null, null);
    expect(section.querySelectorAll('button')).toHaveLength(0);
    Widget.detach(panel);
  });
});
