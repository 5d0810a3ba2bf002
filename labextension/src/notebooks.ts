/**
 * The active notebook, as JupyterLab's shell and notebook tracker tell it, for the controller.
 *
 * The tracker's `currentWidget` stays on the last notebook when a Settings editor, a terminal or
 * a text file becomes the active tab; the shell's current widget does not. So a notebook is
 * "active" only while it is also the shell's current widget.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import { INotebookRef, INotebookSource } from './controller';

export class ActiveNotebook implements INotebookSource {
  constructor(
    private _shell: JupyterFrontEnd.IShell,
    private _tracker: INotebookTracker
  ) {
    _tracker.currentChanged.connect((_, nb) => {
      this._watch(nb);
      this._changed.emit();
    });
    _tracker.widgetAdded.connect((_, nb) => this._watch(nb));
    _shell.currentChanged?.connect(() => this._changed.emit());
    this._watch(_tracker.currentWidget);
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  current(): INotebookRef | null {
    const nb = this._tracker.currentWidget;
    if (!nb || nb.isDisposed) {
      return null;
    }
    // Shells without a current widget (or without the signal) leave the tracker's word standing.
    const active = this._shell.currentChanged ? this._shell.currentWidget : nb;
    if (active !== nb) {
      return null;
    }
    const kernel = nb.sessionContext.session?.kernel ?? null;
    return {
      name: nb.context.localPath.split('/').pop() || nb.title.label,
      path: nb.context.path,
      kernelId: kernel?.id ?? null,
      kernelName: kernel ? nb.sessionContext.kernelDisplayName : null,
      kernelStatus: kernel ? nb.sessionContext.kernelDisplayStatus : null
    };
  }

  private _watch(nb: NotebookPanel | null): void {
    if (!nb || this._watched.has(nb)) {
      return;
    }
    this._watched.add(nb);
    const changed = () => {
      if (nb === this._tracker.currentWidget) {
        this._changed.emit();
      }
    };
    nb.sessionContext.kernelChanged.connect(changed);
    nb.sessionContext.statusChanged.connect(changed);
    nb.sessionContext.ready.then(changed).catch(() => undefined);
    nb.context.pathChanged.connect(changed);
  }

  private _watched = new WeakSet<NotebookPanel>();
  private _changed = new Signal<this, void>(this);
}
