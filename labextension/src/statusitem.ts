/**
 * The status-bar item: the active notebook's GPU in a few characters ("GPU0 37% 12.1G"), or
 * "GPU –" when the notebook uses none, then the state of the data in brackets when it is not
 * live ("(replay)", "(stale 12 s)", "(offline)"); a click opens the panel, a click with Ctrl (⌘
 * on a Mac) the GPU dashboard. What it says comes from `statusView` (model.ts); this only draws it.
 */
import { IStatusView } from './model';
import { ShownWidget } from './shown';

/**
 * On screen only where JupyterLab shows it (not on other tabs) and while the status bar is shown
 * (View → Show Status Bar): `visibilityChanged` says when.
 */
export class GpuStatusItem extends ShownWidget {
  /** `onClick(dashboard)`: `dashboard` when Ctrl or ⌘ was held. */
  constructor(onClick: (dashboard: boolean) => void) {
    super({ node: document.createElement('div') });
    this.addClass('jp-gpuctx-status');
    this._button = document.createElement('button');
    this._button.type = 'button';
    this._button.className = 'jp-gpuctx-status-button';
    this._button.addEventListener('click', ev => onClick(ev.ctrlKey || ev.metaKey));
    this._text = document.createElement('span');
    this._text.className = 'jp-gpuctx-status-text';
    // The state ("(replay)", "(stale 12 s)", "(offline)") is a badge of its own, dark text on the
    // theme's light warn colour (readable in light and dark themes); the button's text ends in it.
    this._gap = document.createTextNode('');
    this._replay = document.createElement('span');
    this._replay.className = 'jp-gpuctx-status-replay';
    this._button.append(this._text, this._gap, this._replay);
    this.node.appendChild(this._button);
    this.render({
      state: 'waiting',
      text: 'GPU …',
      badge: '',
      description: 'GPU: waiting for the gpuctx server. Click to open the GPU panel.',
      replay: false,
      warn: false,
      stale: false,
      deviceKey: null
    });
  }

  render(view: IStatusView): void {
    if (this._text.textContent !== view.text) {
      this._text.textContent = view.text;
    }
    // The button's text is exactly "<text>" or "<text> (<badge>)".
    this._gap.data = view.badge ? ' ' : '';
    const badge = view.badge ? `(${view.badge})` : '';
    if (this._replay.textContent !== badge) {
      this._replay.textContent = badge;
    }
    this._replay.hidden = !view.badge;
    this._button.title = view.description;
    this._button.setAttribute('aria-label', view.description);
    this.node.dataset.gpuctxState = view.state;
    if (view.deviceKey) {
      this.node.dataset.gpuctxDevice = view.deviceKey;
    } else {
      delete this.node.dataset.gpuctxDevice;
    }
    this.toggleClass('jp-gpuctx-mod-replay', view.replay);
    this.toggleClass('jp-gpuctx-mod-warn', view.warn);
    this.toggleClass('jp-gpuctx-stale', view.stale);
  }

  private _button: HTMLButtonElement;
  private _text: HTMLSpanElement;
  private _gap: Text;
  private _replay: HTMLSpanElement;
}
