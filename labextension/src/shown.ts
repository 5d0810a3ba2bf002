/**
 * A widget that says when it comes on screen and when it leaves (shown or hidden, attached or
 * detached): the page's stream and kernel polling run only while something that draws them shows.
 */
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

export class ShownWidget extends Widget {
  /** Emits whether the widget is now on screen. */
  get visibilityChanged(): ISignal<this, boolean> {
    return this._visibilityChanged;
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._visibilityChanged.emit(true);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._visibilityChanged.emit(false);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._visibilityChanged.emit(this.isVisible);
  }

  protected onBeforeDetach(msg: Message): void {
    this._visibilityChanged.emit(false);
    super.onBeforeDetach(msg);
  }

  private _visibilityChanged = new Signal<this, boolean>(this);
}
