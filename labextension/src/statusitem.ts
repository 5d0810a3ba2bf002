/** The status-bar item: the active notebook's GPU in a few characters; a click opens the panel. */
import { Widget } from '@lumino/widgets';

export class GpuStatusItem extends Widget {
  constructor(onClick: () => void) {
    super({ node: document.createElement('div') });
    this.addClass('jp-gpuctx-status');
    this._button = document.createElement('button');
    this._button.type = 'button';
    this._button.className = 'jp-gpuctx-status-button';
    this._button.addEventListener('click', onClick);
    this.node.appendChild(this._button);
    this.setText('GPU …', 'GPU: waiting for the gpuctx server. Click to open the GPU panel.', false);
  }

  /** Sets the text and the tooltip/aria-label; `replay` marks replayed data. */
  setText(text: string, description: string, replay: boolean): void {
    if (this._button.textContent !== text) {
      this._button.textContent = text;
    }
    this._button.title = description;
    this._button.setAttribute('aria-label', description);
    this.toggleClass('jp-gpuctx-mod-replay', replay);
  }

  private _button: HTMLButtonElement;
}
