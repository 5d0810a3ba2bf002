/**
 * The one connection to the server's GPU stream that the whole page shares.
 *
 * Open only while someone needs data (the panel is visible, or a status-bar item is on screen):
 * consumers say so with `demand(key, on)`. A browser tab left in the background lets it go too,
 * after a grace period (`setPageHidden`): fifty tabs open in the background cost the server
 * nothing, and one shown again connects at once, its history filling the gap. A dropped
 * connection is retried with exponential back-off; a REST read fills the gap so that a newly
 * shown panel is never empty while the stream's first tick is on its way. That read is also how a refusal is told from an outage: a
 * browser says nothing about why a websocket failed, but a 403 on the read means the server
 * refuses this page (its login expired), and the stream stops in `refused` instead of retrying,
 * until it next starts (a reload, or demand again after none). The socket and timers are
 * injected, so this is tested without a browser or a server.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { backoffDelay, DEFAULT_BACKOFF, IBackoffOptions, isRefusal } from './backoff';
import { IHello, IHistoryMessage, ISnapshot } from './types';

/** `waiting`: to retry after a drop; `refused`: the server answered 403, nothing is retried. */
export type StreamState = 'idle' | 'connecting' | 'open' | 'waiting' | 'refused';

/** What the stream needs from a WebSocket (the browser's, or a fake in tests). */
export interface ISocket {
  /** 0 while connecting (the browser's WebSocket.CONNECTING), 1 once open. */
  readonly readyState?: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  close(code?: number, reason?: string): void;
}

/** What a connection asks for besides snapshots. */
export interface IStreamDetail {
  /** Seconds of the server's history to send first (0: none). */
  history: number;
  /** PCIe and NVLink throughput in the snapshots (a GPU dashboard is open). */
  throughput: boolean;
}

export interface IStreamOptions {
  /** The stream's URL for an interval in seconds (with the token where one is needed). */
  url: (interval: number, detail: IStreamDetail) => string;
  openSocket: (url: string) => ISocket;
  /** One REST read of the snapshot, used when the stream (re)starts. */
  fetchSnapshot?: () => Promise<ISnapshot>;
  interval: number;
  /** What the first connection asks for besides snapshots (none when not given). */
  detail?: IStreamDetail;
  backoff?: IBackoffOptions;
  random?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: unknown) => void;
  /** How long a hidden page keeps its stream, ms (a glance at another tab costs no reconnect). */
  hiddenGrace?: number;
}

/** A hidden page keeps its stream this long by default, ms. */
export const HIDDEN_GRACE_MS = 5000;

export class GpuStream {
  constructor(private _options: IStreamOptions) {
    this._interval = _options.interval;
    if (_options.detail) {
      this._detail = { ..._options.detail };
    }
  }

  get state(): StreamState {
    return this._state;
  }

  get snapshot(): ISnapshot | null {
    return this._snapshot;
  }

  /** The interval the server granted (it clamps requests to its limits). */
  get grantedInterval(): number | null {
    return this._granted;
  }

  get interval(): number {
    return this._interval;
  }

  /** How many reconnects have failed in a row (reset by the first message). */
  get attempts(): number {
    return this._attempts;
  }

  get snapshotChanged(): ISignal<this, ISnapshot> {
    return this._snapshotChanged;
  }

  get stateChanged(): ISignal<this, StreamState> {
    return this._stateChanged;
  }

  /** The server's history, sent once per connection before its first snapshot. */
  get historyReceived(): ISignal<this, IHistoryMessage> {
    return this._historyReceived;
  }

  get detail(): IStreamDetail {
    return this._detail;
  }

  /** Ask for another span of history or for throughput: the next connection does (now, if open). */
  setDetail(detail: IStreamDetail): void {
    if (detail.history === this._detail.history && detail.throughput === this._detail.throughput) {
      return;
    }
    // Less history needs no new connection (the page just draws less); throughput does, both
    // ways: the server reads the links only while a connection asks for them.
    const again = detail.history > this._detail.history || detail.throughput !== this._detail.throughput;
    this._detail = { ...detail };
    if (this._socket && again) {
      this._closeSocket();
      this._attempts = 0;
      this._connect();
    }
  }

  /** `key` needs data (`on`), or no longer does. The socket is open while any key does. */
  demand(key: string, on: boolean): void {
    if (on) {
      this._demand.add(key);
    } else {
      this._demand.delete(key);
    }
    this._reconcile();
  }

  get wanted(): boolean {
    return this._demand.size > 0 && !this._away && !this._disposed;
  }

  /**
   * The page was hidden (another browser tab, a minimised window: `document.hidden`), or shown
   * again. Hidden for `hiddenGrace` ms, the stream stops as if nobody needed data; shown, it
   * starts again at once (a REST read, then the connection with its history).
   */
  setPageHidden(hidden: boolean): void {
    this._clearAwayTimer();
    if (!hidden) {
      if (this._away) {
        this._away = false;
        this._reconcile();
      }
      return;
    }
    if (this._away) {
      return;
    }
    const set = this._options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this._awayTimer = set(() => {
      this._awayTimer = null;
      this._away = true;
      this._reconcile();
    }, this._options.hiddenGrace ?? HIDDEN_GRACE_MS);
  }

  /** Whether the stream is let go because the page is hidden. */
  get away(): boolean {
    return this._away;
  }

  /** A new refresh rate: reconnect with it if the stream is running. */
  setInterval(seconds: number): void {
    if (!(seconds > 0) || seconds === this._interval) {
      return;
    }
    this._interval = seconds;
    if (this._socket) {
      this._closeSocket();
      this._attempts = 0;
      this._connect();
    }
  }

  dispose(): void {
    this._disposed = true;
    this._demand.clear();
    this._clearAwayTimer();
    this._stop();
    Signal.clearData(this);
  }

  private _reconcile(): void {
    if (this.wanted && this._state === 'idle') {
      this._attempts = 0;
      void this._refresh();
      this._connect();
    } else if (!this.wanted && this._state !== 'idle') {
      this._stop();
    }
  }

  private async _refresh(): Promise<void> {
    if (!this._options.fetchSnapshot) {
      return;
    }
    const run = this._runs;
    try {
      const snapshot = await this._options.fetchSnapshot();
      if (this.wanted) {
        this._publish(snapshot);
      }
    } catch (err) {
      // No answer: the stream's retries report the state. A refusal: stop knocking.
      if (isRefusal(err) && this.wanted && run === this._runs) {
        this._stop('refused');
      }
    }
  }

  private _connect(): void {
    this._setState('connecting');
    const socket = this._options.openSocket(this._options.url(this._interval, this._detail));
    this._socket = socket;
    socket.onopen = () => {
      if (this._socket === socket) {
        this._setState('open');
      }
    };
    socket.onmessage = ev => {
      if (this._socket === socket) {
        this._onMessage(ev.data);
      }
    };
    socket.onerror = () => {
      // onclose follows and schedules the retry.
    };
    socket.onclose = () => {
      if (this._socket !== socket) {
        return;
      }
      this._socket = null;
      if (this.wanted) {
        this._scheduleRetry();
      } else {
        this._setState('idle');
      }
    };
  }

  private _onMessage(data: unknown): void {
    let msg: { type?: string };
    try {
      msg = JSON.parse(String(data));
    } catch {
      return;
    }
    this._attempts = 0;
    if (msg.type === 'hello') {
      this._granted = (msg as IHello).interval;
      return;
    }
    if (msg.type === 'history') {
      this._historyReceived.emit(msg as unknown as IHistoryMessage);
      return;
    }
    if (Array.isArray((msg as ISnapshot).devices)) {
      this._publish(msg as ISnapshot);
    }
  }

  private _publish(snapshot: ISnapshot): void {
    if (this._snapshot && snapshot.time < this._snapshot.time) {
      return; // an older REST answer that arrived after a stream message
    }
    this._snapshot = snapshot;
    this._snapshotChanged.emit(snapshot);
  }

  private _scheduleRetry(): void {
    const delay = backoffDelay(this._attempts, this._options.backoff ?? DEFAULT_BACKOFF, this._options.random);
    this._attempts++;
    this._setState('waiting');
    const set = this._options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this._timer = set(() => {
      this._timer = null;
      if (this.wanted) {
        void this._refresh();
        this._connect();
      }
    }, delay);
  }

  /** Stop, in `idle` (nobody needs data) or `refused`; a later start is a new run. */
  private _stop(state: 'idle' | 'refused' = 'idle'): void {
    this._runs++;
    if (this._timer !== null) {
      (this._options.clearTimeout ?? (h => clearTimeout(h as ReturnType<typeof setTimeout>)))(this._timer);
      this._timer = null;
    }
    this._closeSocket();
    this._setState(state);
  }

  /**
   * Let go of the socket. One still connecting is closed once it is open: closing it before the
   * handshake ends makes the browser log "WebSocket is closed before the connection is
   * established" (the page's demand can flip while JupyterLab lays itself out at load).
   */
  private _closeSocket(): void {
    const socket = this._socket;
    this._socket = null;
    if (!socket) {
      return;
    }
    socket.onmessage = socket.onerror = socket.onclose = null;
    if (socket.readyState === 0) {
      socket.onopen = () => {
        socket.onopen = null;
        socket.close(1000, 'not needed');
      };
      return;
    }
    socket.onopen = null;
    socket.close(1000, 'not needed');
  }

  private _clearAwayTimer(): void {
    if (this._awayTimer !== null) {
      (this._options.clearTimeout ?? (h => clearTimeout(h as ReturnType<typeof setTimeout>)))(this._awayTimer);
      this._awayTimer = null;
    }
  }

  private _setState(state: StreamState): void {
    if (state !== this._state) {
      this._state = state;
      this._stateChanged.emit(state);
    }
  }

  private _interval: number;
  private _detail: IStreamDetail = { history: 0, throughput: false };
  private _granted: number | null = null;
  private _state: StreamState = 'idle';
  private _socket: ISocket | null = null;
  private _timer: unknown = null;
  private _attempts = 0;
  /** Counts stops: a REST answer from before the last stop is not this run's. */
  private _runs = 0;
  private _disposed = false;
  private _demand = new Set<string>();
  private _away = false;
  private _awayTimer: unknown = null;
  private _snapshot: ISnapshot | null = null;
  private _snapshotChanged = new Signal<this, ISnapshot>(this);
  private _stateChanged = new Signal<this, StreamState>(this);
  private _historyReceived = new Signal<this, IHistoryMessage>(this);
}
