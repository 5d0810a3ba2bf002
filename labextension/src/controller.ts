/**
 * What the page knows and when it asks: the one GPU stream, the history fed from it, the
 * active notebook and its kernel's own GPU view, whether the data is stale, and the kernel
 * actions. The panel and the status bar only draw what this holds.
 *
 * The kernel's view is a control-channel round trip, so it is asked through a `@lumino/polling`
 * `Poll`: every few seconds while someone looks (the panel is visible, or the status-bar item is on
 * screen), on standby while the browser tab is hidden, backing off (capped) while the server does
 * not answer, and not at all once the server says the kernel is gone (404) or refuses this page
 * (403: nothing a retry changes). Its clock, timers and randomness are injected, as the stream's
 * are, so all of this is tested without a browser or a server (the poll's own timers are the
 * global ones, which tests replace with fake ones).
 *
 * The back-off is ours (backoff.ts), set as the poll's interval after each answer: the poll's
 * built-in one draws each wait at random between the last wait × 3 and the base interval, and
 * after an immediate first request (the last wait is 0) that range reaches down to 1 ms.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { actionSpec, actionWording, IActionWording, IKernelActionSpec } from './actions';
import { backoffDelay, httpStatus, IBackoffOptions, isRefusal } from './backoff';
import { formatBytes, formatClock } from './format';
import { DeviceHistory } from './history';
import {
  connectionView,
  IConnectionView,
  IStatusView,
  kernelLabel,
  OUTAGE_TEXT,
  panelView,
  REFUSED_TEXT,
  statusView
} from './model';
import { DEFAULT_SETTINGS, IGpuSettings } from './settings';
import { GpuStream, StreamState } from './stream';
import {
  IHistoryMessage,
  IKernelRef,
  IKernelView,
  IReleaseResult,
  IResumeResult,
  ISnapshot,
  ISuspended,
  KernelAction
} from './types';

/** The notebook in the main area's active tab, and its kernel. */
export interface INotebookRef {
  name: string;
  path: string;
  kernelId: string | null;
  kernelName: string | null;
  kernelStatus: string | null;
}

/** Where the controller learns which notebook is active (JupyterLab's shell, or a fake). */
export interface INotebookSource {
  /** The active tab's notebook; null when the active tab is not a notebook (Settings, a terminal). */
  current(): INotebookRef | null;
  /** Emitted when the active tab, or its notebook's kernel, path or status, may have changed. */
  readonly changed: ISignal<unknown, void>;
}

/** A kernel action asked for by a button; the controller confirms it and calls the server. */
export interface IActionRequest {
  kernelId: string;
  action: KernelAction;
  /** What the confirmation names: the notebook or process. */
  label: string;
}

/** How fresh the data is and whether the server answers. */
export interface IHealth {
  connection: StreamState;
  /** Reconnect attempts that failed in a row. */
  attempts: number;
  /** The last snapshot is older than two stream intervals. */
  stale: boolean;
  /** When the last snapshot arrived, ms since the epoch (the browser's clock). */
  lastUpdate: number | null;
  /** The server does not answer (the stream is retrying, or a kernel-view request failed). */
  outage: boolean;
  /** The one state every view shows: live, replay, stale for N s, offline, refused, connecting. */
  state: IConnectionView;
}

/** The longest range the GPU dashboard shows, s: what the page keeps while one is open. */
export const DASHBOARD_SECONDS = 3600;

/** A message for the user that does not need an answer (JupyterLab's notifications). */
export interface INotice {
  message: string;
  type: 'info' | 'success' | 'warning' | 'error';
  /** Stays until dismissed (a warning about what is about to happen). */
  sticky: boolean;
  /** Offer to open the GPU panel. */
  showPanel?: boolean;
}

export interface IControllerOptions {
  stream: GpuStream;
  history: DeviceHistory;
  /** Null where there is no notebook tracker: no notebook section, no status item. */
  notebooks: INotebookSource | null;
  fetchKernelView: (kernelId: string) => Promise<IKernelView>;
  /** `POST …/kernels/<id>/<api>`. */
  kernelAction: (kernelId: string, api: string) => Promise<unknown>;
  /** Ask the user; true to go ahead. */
  confirm: (wording: IActionWording, spec: IKernelActionSpec) => Promise<boolean>;
  reportError: (title: string, message: string) => unknown;
  /** Show a notification; returns its id (for `dismiss`). Without it, nothing is shown. */
  notify?: (notice: INotice) => string | void;
  /** Take back a notification that no longer holds (the kernel was used again, or is gone). */
  dismiss?: (id: string) => void;
  /** Milliseconds since the epoch. */
  now?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: unknown) => void;
  /** How often the kernel's view is asked while it is needed, ms. */
  kernelViewPeriod?: number;
  /** The longest wait between kernel-view requests while the server does not answer, ms. */
  kernelViewMaxBackoff?: number;
  /** 0..1, for the back-off's jitter. */
  random?: () => number;
}

/** The kernel's view is asked over its control channel: not more often than this (ms). */
export const KERNEL_VIEW_PERIOD = 5000;
export const KERNEL_VIEW_MAX_BACKOFF = 30000;

/** What Suspend or Resume did, in words. */
export function suspendNotice(action: 'suspend' | 'resume', result: unknown, label: string): INotice {
  const seconds = (result as { seconds?: number } | null)?.seconds;
  const took = typeof seconds === 'number' ? ` in ${seconds.toFixed(1)} s` : '';
  if (action === 'resume') {
    return { message: `Resumed ${label}${took}: its GPU memory is back.`, type: 'success', sticky: false };
  }
  const moved = (result as ISuspended | null)?.moved_total;
  const what = typeof moved === 'number' ? `${formatBytes(moved)} of GPU memory` : 'its GPU memory';
  return {
    message: `Suspended ${label}: ${what} moved to host memory${took}; its variables stay, and it resumes on its next cell.`,
    type: 'success',
    sticky: false
  };
}

/** What "Release cache" gave back, in words: "Released 60.0 GiB from train.ipynb". */
export function releaseNotice(result: IReleaseResult | null | undefined, label: string): INotice {
  const failure = `Could not release the cached GPU memory of ${label}`;
  if (!result || typeof result !== 'object') {
    return { message: `${failure}: the server gave no answer.`, type: 'error', sticky: false };
  }
  if (result.status !== 'ok') {
    const why = result.reason || result.status || 'no reason given';
    return { message: `${failure}: ${why}`, type: 'error', sticky: false };
  }
  if (result.no_gpu) {
    const why = typeof result.no_gpu === 'string' ? ` (${result.no_gpu})` : '';
    return { message: `${label} uses no GPU: nothing to release${why}.`, type: 'info', sticky: false };
  }
  const total = typeof result.released_total === 'number' ? result.released_total : null;
  if (total === null || total <= 0) {
    return { message: `${label} held no cached GPU memory: nothing to release.`, type: 'info', sticky: false };
  }
  const parts = Object.entries(result.released ?? {}).filter(([, bytes]) => typeof bytes === 'number' && bytes > 0);
  const detail = parts.length > 1 ? ` (${parts.map(([fw, bytes]) => `${fw} ${formatBytes(bytes)}`).join(', ')})` : '';
  return { message: `Released ${formatBytes(total)} from ${label}${detail}`, type: 'success', sticky: false };
}

/** The warning that the server will shut an idle GPU notebook down. */
export function cullNotice(kernel: IKernelRef, bytes: number | null, replay: boolean): INotice {
  const label = kernelLabel(kernel);
  const at = typeof kernel.cull_at === 'number' ? formatClock(kernel.cull_at * 1000, false) : 'soon';
  const free = bytes !== null && bytes > 0 ? ` to free ${formatBytes(bytes)}` : '';
  return {
    message:
      `Idle GPU notebook ${label} will be shut down at ${at}${free}; run a cell to keep it` +
      (replay ? ' (replay of a recorded trace, not live data)' : ''),
    type: 'warning',
    sticky: true,
    showPanel: true
  };
}

export { httpStatus };

/**
 * A failure in words a person can act on (never the browser's "TypeError: Failed to fetch"): no
 * answer (fetch's TypeError, which @jupyterlab/services' NetworkError is); a bare 403 ("Forbidden")
 * as a refusal with what to do; else its own message ("Kernel is dead", the server's refusal).
 */
export function describeFailure(err: unknown): string {
  const message = err instanceof Error ? err.message : '';
  if (httpStatus(err) === null && (err instanceof TypeError || !(err instanceof Error) || !message)) {
    return 'The Jupyter server did not answer: check that it is still running, then try again.';
  }
  if (isRefusal(err) && (!message || /^(Forbidden|Invalid response: 403\b.*)$/.test(message))) {
    return REFUSED_TEXT;
  }
  return message || String(err);
}

export class GpuController {
  constructor(private _options: IControllerOptions) {
    this._now = _options.now ?? (() => Date.now());
    this._setTimeout = _options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this._clearTimeout = _options.clearTimeout ?? (h => clearTimeout(h as ReturnType<typeof setTimeout>));
    const period = _options.kernelViewPeriod ?? KERNEL_VIEW_PERIOD;
    this._backoff = {
      initial: period,
      factor: 2,
      max: Math.max(period, _options.kernelViewMaxBackoff ?? KERNEL_VIEW_MAX_BACKOFF),
      jitter: 0.2
    };
    this._poll = new Poll<void>({
      auto: false,
      factory: () => this._askKernel(),
      name: 'gpuctx:kernel-view',
      standby: 'when-hidden'
    });
    // Set after construction (the constructor would raise a ceiling below 30 s to 30 s).
    this._poll.frequency = { interval: period, backoff: false, max: this._backoff.max };
    _options.stream.snapshotChanged.connect(this._onSnapshot, this);
    _options.stream.stateChanged.connect(this._onStreamState, this);
    _options.stream.historyReceived.connect(this._onHistory, this);
    this._applyDetail();
    _options.notebooks?.changed.connect(this._onNotebookChanged, this);
    this._notebook = _options.notebooks?.current() ?? null;
    this._viewKernel = this._notebook?.kernelId ?? null;
    this._reconcile();
  }

  get history(): DeviceHistory {
    return this._options.history;
  }

  get settings(): IGpuSettings {
    return this._settings;
  }

  get snapshot(): ISnapshot | null {
    return this._options.stream.snapshot;
  }

  get notebook(): INotebookRef | null {
    return this._notebook;
  }

  /** The active notebook's kernel's own answer; null until it has answered. */
  get kernelView(): IKernelView | null {
    return this._kernelView;
  }

  get health(): IHealth {
    const stream = this._options.stream;
    const refused = stream.state === 'refused';
    const offline = stream.state === 'waiting' || this._unreachable;
    const snapshot = stream.snapshot;
    return {
      connection: stream.state,
      attempts: stream.attempts,
      stale: this._stale,
      lastUpdate: this._receivedAt,
      // A hung server keeps its socket open but says nothing: data that went stale is an outage too.
      outage: offline || this._stale,
      state: connectionView({
        refused,
        offline,
        staleFor: this._stale && this._receivedAt !== null ? (this._now() - this._receivedAt) / 1000 : null,
        lastUpdate: this._receivedAt,
        hasData: snapshot !== null,
        replay: snapshot?.replay ? panelView({ ...snapshot, devices: [] }).replay : null
      })
    };
  }

  /** The status-bar item is shown: the setting is on and the active tab is a notebook. */
  get statusShown(): boolean {
    return this._settings.showStatusBar && this._notebook !== null;
  }

  /**
   * The status-bar item is shown and on screen: a hidden status bar (View → Show Status Bar), or
   * a page without one, displays nothing, and nothing is streamed or asked for it.
   */
  get statusOnScreen(): boolean {
    return this.statusShown && this._statusVisible;
  }

  /** Whether the kernel-view poll is running (not stopped, not disposed). */
  get polling(): boolean {
    const phase = this._poll.state.phase;
    return phase !== 'stopped' && phase !== 'constructed' && phase !== 'disposed';
  }

  /** A new snapshot arrived (the history already holds it). */
  get snapshotChanged(): ISignal<this, ISnapshot> {
    return this._snapshotChanged;
  }

  /** The active notebook, its kernel or the kernel's view changed. */
  get notebookChanged(): ISignal<this, void> {
    return this._notebookChanged;
  }

  /** The connection, staleness or outage changed. */
  get healthChanged(): ISignal<this, IHealth> {
    return this._healthChanged;
  }

  /** `statusShown` changed. */
  get statusShownChanged(): ISignal<this, void> {
    return this._statusShownChanged;
  }

  /** The status-bar item as it should read now. */
  statusView(): IStatusView {
    return statusView({
      snapshot: this.snapshot,
      kernelId: this._notebook?.kernelId ?? null,
      kernelView: this._kernelView,
      warnPercent: this._settings.memoryWarningPercent,
      connection: this.health.state
    });
  }

  /** The server's history arrived (the stream's first message): the charts can draw it. */
  get historyChanged(): ISignal<this, void> {
    return this._historyChanged;
  }

  /** Whether a GPU dashboard is open (attached, whether or not its tab is in front). */
  get dashboardOpen(): boolean {
    return this._dashboards > 0;
  }

  /**
   * A dashboard opened (`true`) or closed: while one is open the page keeps, and asks the server
   * for, the dashboard's longest range, with link throughput; the stream runs for it.
   */
  setDashboardOpen(open: boolean): void {
    this._dashboards = Math.max(0, this._dashboards + (open ? 1 : -1));
    this._applyDetail();
    this._reconcile();
  }

  private _applyDetail(): void {
    const open = this._dashboards > 0;
    const seconds = open ? DASHBOARD_SECONDS : this._settings.historyLength;
    this._options.history.keepAtLeast(open ? DASHBOARD_SECONDS : 0);
    this._options.stream.setDetail({ history: seconds, throughput: open });
  }

  configure(settings: IGpuSettings): void {
    const shown = this.statusShown;
    this._settings = settings;
    this._options.history.configure(settings.historyLength, settings.refreshRate);
    this._options.stream.setInterval(settings.refreshRate);
    this._applyDetail();
    if (shown !== this.statusShown) {
      this._statusShownChanged.emit();
    }
    this._reconcile();
    this._checkStale();
  }

  /** Whether the status-bar item is on screen (its widget's visibility); false until told. */
  setStatusVisible(visible: boolean): void {
    if (visible !== this._statusVisible) {
      this._statusVisible = visible;
      this._reconcile();
    }
  }

  setPanelVisible(visible: boolean): void {
    if (visible !== this._panelVisible) {
      this._panelVisible = visible;
      this._reconcile();
    }
  }

  /** Ask the active notebook's kernel now (after an action, or when the server is back). */
  refreshKernelView(): void {
    if (this._kernelViewWanted()) {
      void this._poll.refresh();
    }
  }

  /** Confirm, then act. Resolves to whether the action was sent; a refusal is reported, not thrown. */
  async runAction(request: IActionRequest): Promise<boolean> {
    const spec = actionSpec(request.action);
    const wording = actionWording(request.action, request.label);
    if (!(await this._options.confirm(wording, spec))) {
      return false;
    }
    let done = false;
    let answer: unknown = null;
    try {
      answer = await this._options.kernelAction(request.kernelId, spec.api);
      done = true;
    } catch (err) {
      await this._options.reportError(wording.failure, describeFailure(err));
    }
    if (done && request.action === 'release') {
      this._notify(releaseNotice(answer as IReleaseResult, request.label));
    }
    if (done && (request.action === 'suspend' || request.action === 'resume')) {
      this._notify(suspendNotice(request.action, answer as ISuspended | IResumeResult, request.label));
    }
    if (done && request.action === 'shutdown') {
      // Gone for sure: not one more request (its 404 would land in the browser's console).
      this._markGone(request.kernelId);
    } else if (request.kernelId === this._notebook?.kernelId) {
      this._setKernelView(request.kernelId, null);
      this.refreshKernelView();
    }
    return true;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._poll.dispose();
    this._clearWatchdog();
    this._clearTicker();
    this._options.stream.demand('panel', false);
    this._options.stream.demand('statusbar', false);
    this._options.stream.demand('dashboard', false);
    Signal.disconnectAll(this);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  // ---- the stream and staleness ----

  private _onHistory(stream: GpuStream, message: IHistoryMessage): void {
    if (stream.grantedInterval) {
      this._options.history.setInterval(stream.grantedInterval);
    }
    this._options.history.merge(message);
    this._historyChanged.emit();
  }

  private _onSnapshot(stream: GpuStream, snapshot: ISnapshot): void {
    if (stream.grantedInterval) {
      this._options.history.setInterval(stream.grantedInterval);
    }
    this._options.history.addSnapshot(snapshot);
    const kind = `${this._receivedAt === null}|${snapshot.replay?.source ?? ''}`;
    this._receivedAt = this._now();
    this._armWatchdog(); // fresh again, and stale two intervals from now unless another comes
    if (kind !== this._dataKind) {
      this._dataKind = kind; // the first data, or a replay that started or ended: the state says so
      this._emitHealth();
    }
    this._warnCulls(snapshot);
    this._snapshotChanged.emit(snapshot);
  }

  // ---- notifications ----

  private _notify(notice: INotice): string | null {
    if (this._disposed || !this._options.notify) {
      return null;
    }
    try {
      return this._options.notify(notice) || null;
    } catch (err) {
      console.warn('gpuctx: could not show a notification', err);
      return null;
    }
  }

  /**
   * One notification per kernel and `cull_at`, not one per sample: a new `cull_at` (the kernel
   * was used, then idled again) warns again; a warning that no longer holds is taken back.
   */
  private _warnCulls(snapshot: ISnapshot): void {
    const warned = new Map<string, { kernel: IKernelRef; bytes: number | null }>();
    for (const device of snapshot.devices ?? []) {
      for (const p of device.processes ?? []) {
        const k = p.kernel;
        if (!k || !k.cull_warning || typeof k.cull_at !== 'number' || p.standby) {
          continue;
        }
        const seen = warned.get(k.id);
        const used = typeof p.used_memory === 'number' ? p.used_memory : null;
        const bytes = used === null ? (seen?.bytes ?? null) : (seen?.bytes ?? 0) + used;
        warned.set(k.id, { kernel: k, bytes });
      }
    }
    for (const [kernelId, shown] of Array.from(this._cullWarnings)) {
      const now = warned.get(kernelId);
      if (!now || now.kernel.cull_at !== shown.cullAt) {
        if (shown.id !== null) {
          this._options.dismiss?.(shown.id);
        }
        this._cullWarnings.delete(kernelId);
      }
    }
    for (const [kernelId, { kernel, bytes }] of warned) {
      const key = `${kernelId}@${kernel.cull_at}`;
      if (!this._cullWarnings.has(kernelId) && !this._cullWarned.has(key)) {
        // Never the same warning twice, even if a sample without it came in between.
        this._cullWarned.add(key);
        const id = this._notify(cullNotice(kernel, bytes, !!snapshot.replay));
        this._cullWarnings.set(kernelId, { cullAt: kernel.cull_at!, id });
      }
    }
  }

  private _onStreamState(_: GpuStream, state: StreamState): void {
    if (this._streamState === 'idle' && state !== 'idle') {
      this._startedAt = this._now(); // started again (shown again, or a tab come back): not stale yet
    }
    this._streamState = state;
    if (state === 'open' && this._unreachable) {
      this.refreshKernelView(); // the server is back: do not wait out the back-off
    }
    this._armWatchdog();
    this._emitHealth();
  }

  /** Two intervals of the stream, in ms: data older than this is stale. */
  private _staleAfter(): number {
    const stream = this._options.stream;
    return 2 * (stream.grantedInterval ?? stream.interval) * 1000;
  }

  /** What staleness counts from: the last data, or the stream's start if later (none: no data yet). */
  private _freshSince(): number | null {
    return this._receivedAt === null ? null : Math.max(this._receivedAt, this._startedAt ?? this._receivedAt);
  }

  private _checkStale(): void {
    const since = this._freshSince();
    const stale = since !== null && this._now() - since > this._staleAfter();
    if (stale !== this._stale) {
      this._stale = stale;
      this._emitHealth();
    }
    this._tickWhileDown();
  }

  /** While the data is stale or the server is gone, the state says for how long: every second. */
  private _tickWhileDown(): void {
    const state = this._options.stream.state;
    const down = this._stale || state === 'waiting' || this._unreachable;
    if (!down || state === 'refused' || !this._options.stream.wanted || this._disposed) {
      this._clearTicker();
      return;
    }
    if (this._ticker === null) {
      this._ticker = this._setTimeout(() => {
        this._ticker = null;
        this._emitHealth();
        this._tickWhileDown();
      }, 1000);
    }
  }

  private _clearTicker(): void {
    if (this._ticker !== null) {
      this._clearTimeout(this._ticker);
      this._ticker = null;
    }
  }

  /** Wake up when the last snapshot turns stale, while anyone needs data. */
  private _armWatchdog(): void {
    this._clearWatchdog();
    this._checkStale();
    if (this._receivedAt === null || this._stale || !this._options.stream.wanted || this._disposed) {
      return;
    }
    const due = Math.max(0, this._freshSince()! + this._staleAfter() - this._now()) + 1;
    this._watchdog = this._setTimeout(() => {
      this._watchdog = null;
      this._armWatchdog();
    }, due);
  }

  private _clearWatchdog(): void {
    if (this._watchdog !== null) {
      this._clearTimeout(this._watchdog);
      this._watchdog = null;
    }
  }

  private _emitHealth(): void {
    if (!this._disposed) {
      this._healthChanged.emit(this.health);
    }
  }

  // ---- the active notebook ----

  private _onNotebookChanged(): void {
    const next = this._options.notebooks?.current() ?? null;
    const prev = this._notebook;
    const shown = this.statusShown;
    this._notebook = next;
    const kernelId = next?.kernelId ?? null;
    const switched = kernelId !== this._viewKernel;
    if (switched) {
      // a kernel not asked any more keeps saying why (gone, refused), not "asking…" for ever
      this._setKernelView(kernelId, kernelId ? (this._settled.get(kernelId) ?? null) : null, false);
      this._setUnreachable(false);
    }
    if (shown !== this.statusShown) {
      this._statusShownChanged.emit();
    }
    this._reconcile(switched);
    if (switched || !sameNotebook(prev, next)) {
      this._notebookChanged.emit();
    }
  }

  // ---- the kernel's own view ----

  private _kernelViewWanted(): boolean {
    const kernelId = this._notebook?.kernelId;
    const looked = this._panelVisible || this.statusOnScreen;
    return !this._disposed && !!kernelId && !this._settled.has(kernelId) && looked;
  }

  /** Open or close the stream and start or stop the poll to match who needs data now. */
  private _reconcile(askNow = false): void {
    if (this._disposed) {
      return;
    }
    this._options.stream.demand('panel', this._panelVisible);
    this._options.stream.demand('statusbar', this.statusOnScreen);
    this._options.stream.demand('dashboard', this._dashboards > 0);
    this._armWatchdog();
    if (!this._kernelViewWanted()) {
      if (this.polling) {
        void this._poll.stop();
      }
      return;
    }
    const phase = this._poll.state.phase;
    if (phase === 'constructed' || phase === 'stopped') {
      void this._poll.start();
    } else if (askNow) {
      void this._poll.refresh();
    }
  }

  /**
   * The poll's factory: one request. It never rejects: the wait before the next request is set
   * here, back to the period after an answer, growing (capped) while the server does not answer.
   */
  private async _askKernel(): Promise<void> {
    const kernelId = this._notebook?.kernelId ?? null;
    if (!kernelId || !this._kernelViewWanted()) {
      return;
    }
    const asked = ++this._asked;
    let view: IKernelView;
    try {
      view = await this._options.fetchKernelView(kernelId);
    } catch (err) {
      if (this._notebook?.kernelId !== kernelId || asked !== this._asked) {
        return; // the user moved on, or a newer question was asked (after a restart: same id)
      }
      const status = httpStatus(err);
      if (status === 404) {
        // Shut down (in another tab, or culled): nothing more to ask until the notebook has
        // another kernel.
        this._setUnreachable(false);
        this._setNextWait(false);
        this._markGone(kernelId);
        return;
      }
      if (isRefusal(err)) {
        // 403: this page's login expired, or this user may not read the kernel. Not an outage,
        // and asking again changes nothing: said once, not asked again until the page reloads.
        this._setUnreachable(false);
        this._setNextWait(false);
        this._settle(kernelId, { kernel_id: kernelId, status: 'refused', reason: describeFailure(err) });
        return;
      }
      if (status === null) {
        // No answer at all: keep the last answer on show (the panel says it is stale), back off.
        this._setUnreachable(true);
        this._setNextWait(true);
        if (this._kernelView === null) {
          this._setKernelView(kernelId, { kernel_id: kernelId, status: 'unreachable', reason: OUTAGE_TEXT });
        }
        return;
      }
      // The server's own refusal, in its words; a server error (5xx) is retried more slowly.
      this._setUnreachable(false);
      this._setNextWait(status >= 500);
      this._setKernelView(kernelId, { kernel_id: kernelId, status: 'error', reason: describeFailure(err) });
      return;
    }
    if (this._notebook?.kernelId === kernelId && asked === this._asked) {
      this._setUnreachable(false);
      this._setNextWait(false);
      this._setKernelView(kernelId, view);
    }
  }

  /** The wait before the next request: the period, or the next back-off step after a failure. */
  private _setNextWait(failed: boolean): void {
    this._failures = failed ? this._failures + 1 : 0;
    const interval = failed
      ? backoffDelay(this._failures - 1, this._backoff, this._options.random)
      : this._backoff.initial;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { interval, backoff: false, max: this._backoff.max };
    }
  }

  /** The kernel no longer exists: never ask for it again. */
  private _markGone(kernelId: string): void {
    this._settle(kernelId, { kernel_id: kernelId, status: 'gone', reason: 'the kernel is no longer running' });
  }

  /** Never ask `kernelId` again; `view` says why wherever its notebook is shown. */
  private _settle(kernelId: string, view: IKernelView): void {
    this._settled.set(kernelId, view);
    if (kernelId === this._notebook?.kernelId) {
      this._setKernelView(kernelId, view);
    }
    this._reconcile();
  }

  private _setKernelView(kernelId: string | null, view: IKernelView | null, emit = true): void {
    this._viewKernel = kernelId;
    this._kernelView = view;
    if (emit && !this._disposed) {
      this._notebookChanged.emit();
    }
  }

  private _setUnreachable(value: boolean): void {
    if (value !== this._unreachable) {
      this._unreachable = value;
      this._emitHealth();
      this._tickWhileDown();
    }
  }

  private _now: () => number;
  private _setTimeout: (fn: () => void, ms: number) => unknown;
  private _clearTimeout: (handle: unknown) => void;
  private _poll: Poll<void>;
  private _asked = 0; // kernel-view questions asked: only the latest one's answer is shown
  private _backoff: IBackoffOptions;
  /** Kernel-view requests that got no answer in a row. */
  private _failures = 0;
  private _settings: IGpuSettings = DEFAULT_SETTINGS;
  private _panelVisible = false;
  private _statusVisible = false;
  private _notebook: INotebookRef | null = null;
  private _kernelView: IKernelView | null = null;
  /** The kernel the view belongs to. */
  private _viewKernel: string | null = null;
  /** Kernels never asked again, with the view that says why: gone (404, shut down), refused (403). */
  private _settled = new Map<string, IKernelView>();
  /** The cull warnings shown: per kernel, the `cull_at` warned of and the notification's id. */
  private _cullWarnings = new Map<string, { cullAt: number; id: string | null }>();
  /** Every `<kernel id>@<cull_at>` warned of. */
  private _cullWarned = new Set<string>();
  private _unreachable = false;
  private _receivedAt: number | null = null;
  private _startedAt: number | null = null;
  private _streamState: StreamState = 'idle';
  private _stale = false;
  private _watchdog: unknown = null;
  private _ticker: unknown = null;
  private _dataKind = '';
  private _dashboards = 0;
  private _disposed = false;
  private _snapshotChanged = new Signal<this, ISnapshot>(this);
  private _notebookChanged = new Signal<this, void>(this);
  private _healthChanged = new Signal<this, IHealth>(this);
  private _statusShownChanged = new Signal<this, void>(this);
  private _historyChanged = new Signal<this, void>(this);
}

function sameNotebook(a: INotebookRef | null, b: INotebookRef | null): boolean {
  if (a === null || b === null) {
    return a === b;
  }
  return (
    a.path === b.path &&
    a.name === b.name &&
    a.kernelId === b.kernelId &&
    a.kernelName === b.kernelName &&
    a.kernelStatus === b.kernelStatus
  );
}
