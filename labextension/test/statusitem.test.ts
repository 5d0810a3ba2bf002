// @vitest-environment jsdom
import { Panel, Widget } from '@lumino/widgets';
import { describe, expect, it } from 'vitest';

import { IStatusView } from '../src/model';
import { GpuStatusItem } from '../src/statusitem';

const GPU: IStatusView = {
  state: 'gpu',
  text: 'GPU0 37% 12.1G',
  description: "This notebook's GPU: cuda:0 NVIDIA H200. Click to open the GPU panel.",
  badge: '',
  replay: false,
  warn: false,
  stale: false,
  deviceKey: 'GPU-aaaa'
};

describe('GpuStatusItem', () => {
  it('starts by waiting for the server, opens the panel on click and the dashboard on Ctrl- or ⌘-click', () => {
    const clicks: boolean[] = [];
    const item = new GpuStatusItem(dashboard => clicks.push(dashboard));
    const button = item.node.querySelector('button')!;
    expect(button.textContent).toBe('GPU …');
    expect(item.node.dataset.gpuctxState).toBe('waiting');
    button.click();
    button.dispatchEvent(new MouseEvent('click', { ctrlKey: true }));
    button.dispatchEvent(new MouseEvent('click', { metaKey: true }));
    expect(clicks).toEqual([false, true, true]);
  });

  it("draws the notebook's GPU, the replay badge, the warning and stale data", () => {
    const item = new GpuStatusItem(() => undefined);
    const button = item.node.querySelector('button')!;
    item.render(GPU);
    expect(button.textContent).toBe('GPU0 37% 12.1G');
    expect(button.getAttribute('aria-label')).toBe(GPU.description);
    expect(button.title).toBe(GPU.description);
    expect(item.node.dataset.gpuctxDevice).toBe('GPU-aaaa');
    item.render({ ...GPU, replay: true, badge: 'replay', warn: true, stale: true });
    expect(button.textContent).toBe('GPU0 37% 12.1G (replay)');
    expect(item.node.querySelector('.jp-gpuctx-status-replay')!.textContent).toBe('(replay)');
    item.render({ ...GPU, replay: true, badge: 'replay, stale 12 s', warn: true, stale: true });
    expect(button.textContent).toBe('GPU0 37% 12.1G (replay, stale 12 s)');
    expect(item.hasClass('jp-gpuctx-mod-replay')).toBe(true);
    expect(item.hasClass('jp-gpuctx-mod-warn')).toBe(true);
    expect(item.hasClass('jp-gpuctx-stale')).toBe(true);
    item.render({ ...GPU, state: 'none', text: 'GPU –', deviceKey: null });
    expect(button.textContent).toBe('GPU –');
    expect(item.node.dataset.gpuctxState).toBe('none');
    expect(item.node.dataset.gpuctxDevice).toBeUndefined();
    expect(item.hasClass('jp-gpuctx-mod-warn')).toBe(false);
    expect(item.hasClass('jp-gpuctx-stale')).toBe(false);
  });

  it('says when it is on screen: not while the status bar is hidden, nor while JupyterLab hides it', () => {
    const bar = new Panel(); // the status bar, its items as children
    const item = new GpuStatusItem(() => undefined);
    const seen: boolean[] = [];
    item.visibilityChanged.connect((_, visible) => seen.push(visible));
    bar.addWidget(item);
    Widget.attach(bar, document.body);
    expect(seen).toEqual([true]);
    bar.hide(); // View → Show Status Bar, unticked
    bar.show();
    item.hide(); // another kind of tab: JupyterLab hides the item
    bar.hide();
    bar.show(); // the bar comes back, the item stays hidden: nothing said
    item.show();
    Widget.detach(bar);
    expect(seen).toEqual([true, false, true, false, true, false]);
  });
});
