/**
 * Warming what is being typed (issue #25): a notebook's code cells as they stand, unsaved edits
 * included, go to its kernel's warm plan (`PUT /gpuctx/api/kernels/<id>/cells`) a second after
 * typing stops, so that the kernel warms what a new cell will need before it is run. A new
 * notebook's file is empty until it is saved: a plan read from disk sees nothing of it.
 *
 * Per notebook: nothing is sent while a cell runs (the kernel is busy: the send waits until it
 * is idle and typing has stopped for a second), nothing twice (the same sources as last sent),
 * only code cells, and nothing more to a kernel that refused (gpuctx is not there, its warm-up
 * is off: the server answers 4xx, or the kernel does not answer twice in a row) until it restarts
 * or the notebook changes kernel. A restarted kernel reads the saved file again, so unsaved edits
 * are sent again once it is idle. Off with the `warmTypedCells` setting. Its timers are injected,
 * so all of this is tested without a browser.
 *
 * One sender per notebook document, not per view (`NotebookTyping`): JupyterLab's "New View for
 * Notebook" shows one document in two panels, and each sending would give the kernel every edit
 * twice. Two notebooks on one kernel are two documents: each still sends its own cells.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { httpStatus } from './backoff';

/** What a notebook gives this module; `fromContext` makes one of JupyterLab's notebook document. */
export interface ITypedNotebook {
  /** The kernel's id; null without a kernel. */
  kernelId(): string | null;
  /** The kernel's status as JupyterLab has it: 'idle', 'busy', 'restarting', … */
  kernelStatus(): string | null;
  /** The sources of the code cells, in order. */
  codeSources(): string[];
  /** The notebook's content changed (typing, cells added, moved or deleted, outputs). */
  readonly contentChanged: ISignal<unknown, void>;
  /** The kernel, or its status, changed. */
  readonly kernelChanged: ISignal<unknown, void>;
  /** The notebook was closed. */
  readonly disposed: ISignal<unknown, void>;
}

/** `PUT …/kernels/<id>/cells`: resolves with the answer's JSON, rejects as api.ts's requests do. */
export type CellsSender = (kernelId: string, cells: string[]) => Promise<{ status?: string }>;

export interface ITypedCellsOptions {
  send: CellsSender;
  /** Sending starts this long after the last change, ms. */
  delay?: number;
  enabled?: boolean;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: unknown) => void;
}

/** Typing stops for this long (ms) before the cells are sent. */
export const TYPING_PAUSE_MS = 1000;
/** A kernel that gives no answer this many times in a row gets no more (gpuctx is not loaded there). */
const SILENT_LIMIT = 2;
const RESTARTING = new Set(['restarting', 'autorestarting', 'starting']);

export class TypedCells {
  constructor(
    private _notebook: ITypedNotebook,
    private _options: ITypedCellsOptions
  ) {
    this._enabled = _options.enabled ?? true;
    this._set = _options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this._clear = _options.clearTimeout ?? (h => clearTimeout(h as ReturnType<typeof setTimeout>));
    this._kernel = _notebook.kernelId();
    _notebook.contentChanged.connect(this._onContent, this);
    _notebook.kernelChanged.connect(this._onKernel, this);
    _notebook.disposed.connect(this.dispose, this);
  }

  get enabled(): boolean {
    return this._enabled;
  }

  /** The `warmTypedCells` setting: off stops any send that is waiting. */
  set enabled(value: boolean) {
    this._enabled = value;
    if (!value) {
      this._disarm();
    } else if (this._dirty) {
      this._arm();
    }
  }

  /** Whether this notebook's kernel has refused its typed cells (until it restarts or changes). */
  get stopped(): boolean {
    return this._stopped;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._disarm();
    Signal.disconnectReceiver(this);
  }

  private _onContent(): void {
    this._dirty = this._edited = true;
    this._arm();
  }

  private _onKernel(): void {
    const id = this._notebook.kernelId();
    const status = this._notebook.kernelStatus();
    if (id !== this._kernel || (status !== null && RESTARTING.has(status))) {
      // another kernel, or a new process of this one: it knows only the saved file
      this._kernel = id;
      this._generation++; // answers still on their way are the old process's
      this._sent = null;
      this._stopped = false;
      this._silent = 0;
      this._dirty = this._dirty || this._edited;
    }
    if (status === 'idle' && this._dirty) {
      this._arm(); // after a cell: typing done meanwhile goes a second after the kernel is idle
    }
  }

  private _arm(): void {
    this._disarm();
    if (this._enabled && !this._disposed) {
      this._timer = this._set(() => this._fire(), this._options.delay ?? TYPING_PAUSE_MS);
    }
  }

  private _disarm(): void {
    if (this._timer !== null) {
      this._clear(this._timer);
      this._timer = null;
    }
  }

  private _fire(): void {
    this._timer = null;
    const id = this._notebook.kernelId();
    if (this._inFlight) {
      this._missed = true; // its answer arms again (a restart meanwhile: the new kernel is sent them)
      return;
    }
    if (!this._enabled || this._disposed || this._stopped || !id) {
      return; // no kernel: its arrival arms again
    }
    if (this._notebook.kernelStatus() !== 'idle') {
      return; // a cell runs: sent once the kernel is idle again (_onKernel)
    }
    const cells = this._notebook.codeSources();
    const key = JSON.stringify(cells);
    this._dirty = false;
    if (key === this._sent) {
      return;
    }
    this._inFlight = true;
    const generation = this._generation;
    this._options
      .send(id, cells)
      .then(
        answer => {
          if (generation !== this._generation) {
            return;
          }
          if (answer?.status === 'ok') {
            this._sent = key;
            this._silent = 0;
          } else if (answer?.status === 'suspended') {
            this._dirty = true; // sent again once it has resumed (its next cell leaves it idle)
          } else if (++this._silent >= SILENT_LIMIT) {
            this._stopped = true; // gpuctx does not answer there: no more messages it cannot read
          } else {
            this._dirty = true;
          }
        },
        err => {
          const status = httpStatus(err);
          if (generation !== this._generation) {
            return;
          }
          if (status !== null && status >= 400 && status < 500) {
            this._stopped = true; // refused (no gpuctx, warming off, too large): not again for this kernel
          } else {
            this._dirty = true; // the server did not answer: the next change tries again
          }
        }
      )
      .finally(() => {
        this._inFlight = false;
        const missed = this._missed;
        this._missed = false;
        if (!this._stopped && (missed || (this._dirty && key !== JSON.stringify(this._notebook.codeSources())))) {
          this._arm(); // typed on, or the kernel changed, while it was on its way
        }
      });
  }

  private _enabled: boolean;
  private _set: (fn: () => void, ms: number) => unknown;
  private _clear: (handle: unknown) => void;
  private _timer: unknown = null;
  private _kernel: string | null;
  private _sent: string | null = null;
  private _dirty = false;
  private _edited = false;
  private _inFlight = false;
  private _missed = false;
  private _stopped = false;
  private _silent = 0;
  private _generation = 0;
  private _disposed = false;
}

/**
 * What this module reads of a notebook's document context (JupyterLab's
 * `DocumentRegistry.IContext<INotebookModel>`, which every view of the document shares).
 */
export interface INotebookContext {
  readonly ready: Promise<void>;
  readonly model: {
    readonly contentChanged: ISignal<unknown, void>;
    readonly cells: Iterable<{ readonly type: string; readonly sharedModel: { getSource(): string } }>;
  } | null;
  readonly sessionContext: {
    readonly session: { readonly kernel: { readonly id: string; readonly status: string } | null } | null;
    readonly kernelChanged: ISignal<unknown, unknown>;
    readonly statusChanged: ISignal<unknown, unknown>;
  };
  /** Emitted once every view of the document is closed. */
  readonly disposed: ISignal<unknown, void>;
  readonly isDisposed: boolean;
}

/** A notebook document as a typed notebook: its model once loaded, its session's kernel. */
export function fromContext(context: INotebookContext): ITypedNotebook {
  const owner = {};
  const contentChanged = new Signal<unknown, void>(owner);
  const kernelChanged = new Signal<unknown, void>(owner);
  const disposed = new Signal<unknown, void>(owner);
  const session = context.sessionContext;
  const kernel = () => session.session?.kernel ?? null;
  void context.ready.then(() => {
    // after loading: the file's own content is what the kernel reads itself
    context.model?.contentChanged.connect(() => contentChanged.emit());
  });
  session.kernelChanged.connect(() => kernelChanged.emit());
  session.statusChanged.connect(() => kernelChanged.emit());
  context.disposed.connect(() => disposed.emit());
  return {
    kernelId: () => kernel()?.id ?? null,
    kernelStatus: () => kernel()?.status ?? null,
    codeSources: () => {
      const model = context.model;
      const out: string[] = [];
      if (!model) {
        return out;
      }
      for (const cell of model.cells) {
        if (cell.type === 'code') {
          out.push(cell.sharedModel.getSource());
        }
      }
      return out;
    },
    contentChanged,
    kernelChanged,
    disposed
  };
}

/** Every open notebook's typed cells: one `TypedCells` per document, however many views show it. */
export class NotebookTyping {
  constructor(private _options: ITypedCellsOptions) {
    this._enabled = _options.enabled ?? true;
  }

  /** The `warmTypedCells` setting, for every notebook. */
  get enabled(): boolean {
    return this._enabled;
  }

  set enabled(value: boolean) {
    this._enabled = value;
    this._byDocument.forEach(cells => (cells.enabled = value));
  }

  /** How many documents are watched (not views). */
  get size(): number {
    return this._byDocument.size;
  }

  /** Watch a notebook view: a second view of a document already watched adds nothing. */
  watch(view: { readonly context: INotebookContext }): TypedCells | null {
    const context = view.context;
    const known = this._byDocument.get(context);
    if (known) {
      return known;
    }
    if (context.isDisposed) {
      return null;
    }
    const cells = new TypedCells(fromContext(context), { ...this._options, enabled: this._enabled });
    this._byDocument.set(context, cells);
    context.disposed.connect(() => this._byDocument.delete(context));
    return cells;
  }

  private _enabled: boolean;
  private _byDocument = new Map<INotebookContext, TypedCells>();
}
