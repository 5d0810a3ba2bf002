/**
 * The "GPUs" sidebar panel: the no-GPU reason first when there is one, the active notebook's
 * own GPU view with its kernel's actions, then one card per GPU (meters, a chart of the last
 * minutes, the processes on it) — or, with many GPUs, one compact row per GPU — and under them
 * the warm reserve (the standby kernels the server keeps ready) when the server keeps one.
 *
 * Plain DOM, updated in place: a card is built once per GPU and only its numbers change on
 * each tick, so a button that has keyboard focus keeps it while the data streams in, and a
 * screen reader is not handed the same banner again every second.
 */
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { actionWording, IOfferContext, KERNEL_ACTIONS, offered } from './actions';
import { HistoryChart } from './chart';
import { IActionRequest, IHealth, INotebookRef } from './controller';
import { formatClock, formatPercent, formatSpan } from './format';
import { DeviceHistory } from './history';
import {
  IDeviceView,
  IDLE_HOLDER_TEXT,
  IKernelRow,
  IPanelView,
  IProcessView,
  IReserveView,
  ISuspendedView,
  kernelRows,
  notebookOffer,
  OUTAGE_TEXT,
  panelView,
  REPLAY_BANNER,
  warnFraction
} from './model';
import { DEFAULT_SETTINGS, IGpuSettings } from './settings';
import { IKernelView, ISnapshot } from './types';

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Set a node's text only when it changed (no needless DOM mutations, no repeated announcements). */
function setText(node: Node, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

function setAttr(node: Element, name: string, value: string): void {
  if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

let uid = 0;

/** A labelled bar: the label and value on one line, the bar across the full width under them. */
interface IMeter {
  root: HTMLElement;
  bar: HTMLElement;
  fill: HTMLElement;
  value: HTMLElement;
}

function createMeter(kind: 'utilization' | 'memory', label: string): IMeter {
  const root = el('div', `jp-gpuctx-meter jp-gpuctx-meter-${kind}`);
  root.dataset.gpuctxMeter = kind;
  const head = el('div', 'jp-gpuctx-meter-head');
  const value = el('span', 'jp-gpuctx-meter-value');
  head.append(el('span', 'jp-gpuctx-meter-label', label), value);
  const bar = el('div', 'jp-gpuctx-meter-bar');
  bar.setAttribute('role', 'meter');
  bar.setAttribute('aria-valuemin', '0');
  bar.setAttribute('aria-valuemax', '100');
  bar.setAttribute('aria-label', label);
  const fill = el('div', 'jp-gpuctx-meter-fill');
  bar.appendChild(fill);
  root.append(head, bar);
  return { root, bar, fill, value };
}

/** `fraction` 0..1 (null: unknown, drawn empty); `valueText` is shown and spoken. */
function updateMeter(meter: IMeter, fraction: number | null, valueText: string, spoken: string, warn = false): void {
  const percent = Math.min(100, Math.max(0, (fraction ?? 0) * 100));
  const width = `${percent}%`;
  if (meter.fill.style.width !== width) {
    meter.fill.style.width = width;
  }
  setAttr(meter.bar, 'aria-valuenow', String(Math.round(percent)));
  setAttr(meter.bar, 'aria-valuetext', spoken);
  setText(meter.value, valueText);
  meter.root.classList.toggle('jp-gpuctx-mod-warn', warn);
}

interface ICard {
  root: HTMLElement;
  title: HTMLElement;
  subtitle: HTMLElement;
  error: HTMLElement;
  oom: HTMLElement;
  oomText: HTMLElement;
  oomDetail: HTMLElement;
  idleHeldLabel: HTMLElement;
  idleHeld: HTMLElement;
  util: IMeter;
  mem: IMeter;
  chart: HistoryChart;
  temperature: HTMLElement;
  power: HTMLElement;
  processes: HTMLElement;
  processKey: string;
  suspendedHeading: HTMLElement;
  suspended: HTMLElement;
  suspendedKey: string;
}

interface IRow {
  root: HTMLElement;
  name: HTMLElement;
  util: IMeter;
  mem: IMeter;
  top: HTMLElement;
  oom: HTMLElement;
}

export class GpuPanel extends Widget {
  constructor(private _history: DeviceHistory) {
    super();
    this.addClass('jp-gpuctx-panel');
    this.node.setAttribute('aria-label', 'GPU panel');

    const header = el('div', 'jp-gpuctx-header');
    header.appendChild(el('h2', 'jp-gpuctx-heading', 'GPUs'));
    this._compactToggle = el('button', 'jp-gpuctx-button jp-gpuctx-compact-toggle', 'Compact');
    this._compactToggle.type = 'button';
    this._compactToggle.title = 'One row per GPU';
    this._compactToggle.setAttribute('aria-pressed', 'false');
    this._compactToggle.hidden = true;
    this._compactToggle.addEventListener('click', () => this.setCompact(!this.compact));
    header.appendChild(this._compactToggle);
    this._connection = el('span', 'jp-gpuctx-connection');
    this._connection.setAttribute('role', 'status');
    header.appendChild(this._connection);
    this.node.appendChild(header);

    this._outage = el('p', 'jp-gpuctx-outage', OUTAGE_TEXT);
    this._outage.setAttribute('role', 'status');
    this._outage.hidden = true;
    this.node.appendChild(this._outage);

    this._freshness = el('p', 'jp-gpuctx-freshness');
    this._freshness.id = `jp-gpuctx-freshness-${++uid}`;
    this._freshness.setAttribute('role', 'status');
    this._freshness.hidden = true;
    this.node.appendChild(this._freshness);

    // The banner is built once; a sample only changes it when the trace does.
    this._replay = el('div', 'jp-gpuctx-replay');
    this._replay.setAttribute('role', 'status');
    this._replay.hidden = true;
    const replayDetail = el('div', 'jp-gpuctx-replay-detail');
    this._replaySource = el('span', 'jp-gpuctx-replay-source');
    this._replayRecorded = el('span', 'jp-gpuctx-replay-recorded');
    this._replayDate = el('span', 'jp-gpuctx-replay-date');
    this._replayRecorded.append(', recorded ', this._replayDate);
    replayDetail.append(this._replaySource, this._replayRecorded);
    this._replay.append(el('strong', undefined, REPLAY_BANNER), replayDetail);
    this.node.appendChild(this._replay);

    // Without a GPU, the reason is what a person needs first.
    this._noGpu = el('p', 'jp-gpuctx-nogpu');
    this._noGpu.setAttribute('role', 'status');
    this._noGpu.textContent = 'Waiting for the gpuctx server…';
    this.node.appendChild(this._noGpu);

    this._notebook = el('section', 'jp-gpuctx-notebook');
    const nbHeading = el('h3', 'jp-gpuctx-section-heading', 'This notebook');
    nbHeading.id = `jp-gpuctx-nb-${++uid}`;
    this._notebook.setAttribute('aria-labelledby', nbHeading.id);
    this._notebook.appendChild(nbHeading);
    this._notebookName = el('div', 'jp-gpuctx-notebook-name');
    this._notebook.appendChild(this._notebookName);
    this._notebookRows = el('dl', 'jp-gpuctx-rows');
    this._notebook.appendChild(this._notebookRows);
    this._notebookActions = el('div', 'jp-gpuctx-actions');
    this._notebook.appendChild(this._notebookActions);
    this.node.appendChild(this._notebook);

    this._devices = el('section', 'jp-gpuctx-devices');
    this._devices.setAttribute('aria-label', 'GPUs on this server');
    this._cardsNode = el('div', 'jp-gpuctx-cards');
    this._devices.appendChild(this._cardsNode);
    this._compactNode = el('ul', 'jp-gpuctx-compact-list');
    this._compactNode.setAttribute('aria-label', 'GPUs, one row each');
    this._compactNode.hidden = true;
    this._devices.appendChild(this._compactNode);
    // The warm reserve, under the GPUs: built once, hidden while the server keeps no pool.
    this._reserve = el('section', 'jp-gpuctx-reserve');
    this._reserve.hidden = true;
    this._reserveHeading = el('h3', 'jp-gpuctx-section-heading jp-gpuctx-reserve-heading');
    this._reserveHeading.id = `jp-gpuctx-reserve-${++uid}`;
    this._reserveHeading.title =
      'Kernels the server starts and warms ahead of time, so that a new or restarted notebook gets one at once';
    this._reserve.setAttribute('aria-labelledby', this._reserveHeading.id);
    this._reserveLines = el('ul', 'jp-gpuctx-reserve-lines');
    this._reserve.append(this._reserveHeading, this._reserveLines);
    this._devices.appendChild(this._reserve);
    this._reclaimed = el('div', 'jp-gpuctx-reclaimed');
    this._reclaimed.hidden = true;
    this._reclaimedList = el('ul', 'jp-gpuctx-reclaimed-list');
    const reclaimedHeading = el('h4', 'jp-gpuctx-processes-heading', 'Reclaimed from idle notebooks');
    this._reclaimed.append(reclaimedHeading, this._reclaimedList);
    this._devices.appendChild(this._reclaimed);
    this._notes = el('ul', 'jp-gpuctx-notes');
    this._devices.appendChild(this._notes);
    this.node.appendChild(this._devices);

    this.setNotebook(null, null);
  }

  /** Emits whether the panel is now visible (the stream runs only while someone looks). */
  get visibilityChanged(): ISignal<this, boolean> {
    return this._visibilityChanged;
  }

  /** A kernel action asked for by a button; the owner confirms it and calls the server. */
  get actionRequested(): ISignal<this, IActionRequest> {
    return this._actionRequested;
  }

  /** One row per GPU instead of cards: the user's choice, else automatic above `compactAbove` GPUs. */
  get compact(): boolean {
    return this._compactChoice ?? this._deviceCount > this._settings.compactAbove;
  }

  /** true/false: the user's choice (the header's toggle); null: automatic again. */
  setCompact(choice: boolean | null): void {
    this._compactChoice = choice;
    this._rerender();
  }

  configure(settings: IGpuSettings): void {
    this._settings = settings;
    this._rerender();
  }

  setHealth(health: IHealth): void {
    const text: Record<IHealth['connection'], string> = {
      idle: '',
      connecting: 'connecting…',
      open: 'connected', // to the server's stream; whether the data is live, the replay banner says
      waiting: `reconnecting (attempt ${health.attempts})…`
    };
    setText(this._connection, text[health.connection]);
    this._connection.dataset.state = health.connection;
    this._outage.hidden = !health.outage;
    const stale = health.stale && health.lastUpdate !== null;
    this.toggleClass('jp-gpuctx-stale', stale);
    this._freshness.hidden = !stale;
    setText(this._freshness, stale ? `Last update ${formatClock(health.lastUpdate!)}` : '');
    if (stale) {
      this._devices.setAttribute('aria-describedby', this._freshness.id);
    } else {
      this._devices.removeAttribute('aria-describedby');
    }
  }

  setSnapshot(snapshot: ISnapshot): void {
    this._snapshot = snapshot;
    this._render(panelView(snapshot, warnFraction(this._settings.memoryWarningPercent)));
    // Whether Suspend or Resume applies in the notebook section follows the server's word.
    if (this._notebookInfo?.kernelId) {
      this._setActions(this._notebookInfo.kernelId, this._notebookInfo.name, this._notebookInfo.kernelStatus);
    }
  }

  setNotebook(info: INotebookRef | null, view: IKernelView | null): void {
    this._notebookInfo = info;
    this._notebookView = view;
    if (!info) {
      setText(this._notebookName, 'No notebook is active.');
      this._notebookName.removeAttribute('title');
      this._renderRows([]);
      this._setActions(null, '', null);
      return;
    }
    const kernel = info.kernelId
      ? `${info.kernelName ?? 'kernel'}${info.kernelStatus ? `, ${info.kernelStatus}` : ''}`
      : 'no kernel';
    setText(this._notebookName, `${info.name} (${kernel})`);
    this._notebookName.title = info.path;
    this._renderRows(info.kernelId ? kernelRows(view) : []);
    this._setActions(info.kernelId, info.name, info.kernelStatus);
  }

  /** Redraw the charts with the theme's colours (after a theme change). */
  redrawCharts(): void {
    this._cards.forEach(card => card.chart.redraw());
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._fitCharts();
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

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._fitCharts();
  }

  private _fitCharts(): void {
    this._cards.forEach(card => void card.chart.fit());
  }

  private _rerender(): void {
    if (this._snapshot) {
      this.setSnapshot(this._snapshot);
    }
  }

  private _render(view: IPanelView): void {
    this._renderReplay(view);
    this._noGpu.hidden = view.noGpu === null;
    if (view.noGpu === null) {
      setText(this._noGpu, '');
    } else if (this._noGpuReason !== view.noGpu) {
      this._noGpu.replaceChildren(el('strong', undefined, 'No GPU'), `: ${view.noGpu}`);
    }
    this._noGpuReason = view.noGpu;
    this._deviceCount = view.devices.length;
    const compact = this.compact;
    if (compact) {
      this.node.dataset.gpuctxCompact = 'true';
    } else {
      delete this.node.dataset.gpuctxCompact;
    }
    this._compactToggle.hidden = view.devices.length === 0;
    setAttr(this._compactToggle, 'aria-pressed', String(compact));
    this._cardsNode.hidden = compact;
    this._compactNode.hidden = !compact;
    this._renderCards(compact ? [] : view.devices);
    this._renderRowsCompact(compact ? view.devices : []);
    this._renderReserve(view.reserve);
    const reclaimedKey = view.reclaimed.join('\n');
    if (reclaimedKey !== this._reclaimedKey) {
      this._reclaimedKey = reclaimedKey;
      this._reclaimed.hidden = view.reclaimed.length === 0;
      this._reclaimedList.replaceChildren(...view.reclaimed.map(n => el('li', undefined, n)));
    }
    const notesKey = view.notes.join('\n');
    if (notesKey !== this._notesKey) {
      this._notesKey = notesKey;
      this._notes.replaceChildren(...view.notes.map(n => el('li', undefined, n)));
    }
  }

  private _renderReserve(reserve: IReserveView | null): void {
    this._reserve.hidden = !reserve;
    this._reserve.classList.toggle('jp-gpuctx-mod-warn', reserve?.tone === 'warn');
    setText(this._reserveHeading, reserve?.headline ?? '');
    const lines = reserve?.lines ?? [];
    const key = lines.join('\n');
    if (key !== this._reserveKey) {
      this._reserveKey = key;
      this._reserveLines.replaceChildren(...lines.map(line => el('li', 'jp-gpuctx-reserve-line', line)));
    }
    this._reserveLines.hidden = lines.length === 0;
  }

  private _renderReplay(view: IPanelView): void {
    const replay = view.replay;
    this.toggleClass('jp-gpuctx-mod-replay', !!replay);
    this._replay.hidden = !replay;
    if (!replay) {
      return;
    }
    setText(this._replaySource, replay.name);
    this._replaySource.title = replay.source;
    this._replayRecorded.hidden = !replay.recorded;
    setText(this._replayDate, replay.recorded);
  }

  private _renderRows(rows: IKernelRow[]): void {
    const key = JSON.stringify(rows);
    if (key === this._rowsKey) {
      return;
    }
    this._rowsKey = key;
    // A <details> the user opened stays open when its row is drawn again.
    const open = new Set(
      Array.from(this._notebookRows.querySelectorAll('details[open]')).map(d => (d as HTMLElement).dataset.row)
    );
    const nodes: HTMLElement[] = [];
    for (const row of rows) {
      const dd = el('dd');
      if (row.detail) {
        const details = el('details', 'jp-gpuctx-details');
        details.dataset.row = row.label;
        details.open = open.has(row.label);
        details.append(el('summary', undefined, row.value), el('div', 'jp-gpuctx-details-text', row.detail));
        dd.appendChild(details);
      } else {
        dd.textContent = row.value;
      }
      nodes.push(el('dt', undefined, row.label), dd);
    }
    this._notebookRows.replaceChildren(...nodes);
  }

  private _setActions(kernelId: string | null, label: string, status: string | null): void {
    const offer: IOfferContext | null = kernelId
      ? { holder: null, ...notebookOffer(this._snapshot, this._notebookView, kernelId, status) }
      : null;
    const key = `${kernelId}|${label}|${offer?.suspendable}|${offer?.suspended}`;
    if (key !== this._actionsKey) {
      this._actionsKey = key;
      this._notebookActions.replaceChildren(...(kernelId && offer ? this._actionButtons(kernelId, label, offer) : []));
    }
    // Nothing to interrupt while the kernel is idle is still allowed: interrupt is harmless.
    const dead = status === 'dead' || status === 'unknown';
    this._notebookActions.querySelectorAll('button').forEach(b => {
      (b as HTMLButtonElement).disabled = dead && b.dataset.action !== 'restart';
    });
  }

  /** The table's buttons for one kernel, as far as `offer` says they apply (actions.ts, `offered`). */
  private _actionButtons(kernelId: string, label: string, offer: IOfferContext): HTMLButtonElement[] {
    return KERNEL_ACTIONS.filter(spec => offered(spec, offer)).map(({ action, verb }) => {
      const button = el('button', `jp-gpuctx-button jp-gpuctx-button-${action}`, verb);
      button.type = 'button';
      button.dataset.action = action;
      const spoken = actionWording(action, label).label;
      button.setAttribute('aria-label', spoken);
      button.title = spoken;
      button.addEventListener('click', () => this._actionRequested.emit({ kernelId, action, label }));
      return button;
    });
  }

  // ---- cards ----

  private _renderCards(devices: IDeviceView[]): void {
    const seen = new Set<string>();
    devices.forEach((device, i) => {
      seen.add(device.key);
      let card = this._cards.get(device.key);
      if (!card) {
        card = this._createCard(device.key);
        this._cards.set(device.key, card);
      }
      if (this._cardsNode.children[i] !== card.root) {
        this._cardsNode.insertBefore(card.root, this._cardsNode.children[i] ?? null);
      }
      this._updateCard(card, device);
    });
    for (const [key, card] of Array.from(this._cards)) {
      if (!seen.has(key)) {
        card.chart.dispose();
        card.root.remove();
        this._cards.delete(key);
      }
    }
  }

  private _createCard(key: string): ICard {
    const root = el('article', 'jp-gpuctx-card');
    root.dataset.gpuctxDevice = key;
    const title = el('h3', 'jp-gpuctx-card-title');
    title.id = `jp-gpuctx-card-${++uid}`;
    root.setAttribute('aria-labelledby', title.id);
    const subtitle = el('div', 'jp-gpuctx-card-subtitle');
    const error = el('div', 'jp-gpuctx-card-error');
    error.setAttribute('role', 'alert');
    error.hidden = true;
    // Built once; its headline is a status, its detail (figures that move) is not announced.
    const oom = el('div', 'jp-gpuctx-oom');
    oom.setAttribute('role', 'status');
    oom.hidden = true;
    const oomText = el('strong', 'jp-gpuctx-oom-text');
    const oomDetail = el('div', 'jp-gpuctx-oom-detail');
    oomDetail.setAttribute('aria-live', 'off');
    oom.append(oomText, oomDetail);
    const util = createMeter('utilization', 'Utilisation');
    const mem = createMeter('memory', 'Memory');
    const chart = new HistoryChart();
    const facts = el('dl', 'jp-gpuctx-rows');
    const temperature = el('dd');
    const power = el('dd');
    const idleHeldLabel = el('dt', undefined, 'Held by idle notebooks');
    const idleHeld = el('dd', 'jp-gpuctx-idle-held');
    idleHeldLabel.hidden = idleHeld.hidden = true;
    facts.append(
      el('dt', undefined, 'Temperature'),
      temperature,
      el('dt', undefined, 'Power'),
      power,
      idleHeldLabel,
      idleHeld
    );
    const procHeading = el('h4', 'jp-gpuctx-processes-heading', 'Processes');
    const processes = el('ul', 'jp-gpuctx-processes');
    // Notebooks suspended from this GPU: NVML no longer lists them, so they have a list of their own.
    const suspendedHeading = el('h4', 'jp-gpuctx-processes-heading', 'Suspended (in host memory)');
    const suspended = el('ul', 'jp-gpuctx-suspended');
    suspendedHeading.hidden = suspended.hidden = true;
    root.append(
      title,
      subtitle,
      error,
      oom,
      util.root,
      mem.root,
      chart.node,
      facts,
      procHeading,
      processes,
      suspendedHeading,
      suspended
    );
    return {
      root,
      title,
      subtitle,
      error,
      oom,
      oomText,
      oomDetail,
      idleHeldLabel,
      idleHeld,
      util,
      mem,
      chart,
      temperature,
      power,
      processes,
      processKey: '',
      suspendedHeading,
      suspended,
      suspendedKey: ''
    };
  }

  private _memoryWarning(d: IDeviceView): string {
    if (!d.memoryWarn) {
      return '';
    }
    const use = formatPercent((d.memoryFraction ?? 0) * 100);
    return `Memory use ${use} is above the ${formatPercent(this._settings.memoryWarningPercent)} warning threshold`;
  }

  private _updateCard(card: ICard, d: IDeviceView): void {
    setText(card.title, d.title);
    card.title.title = d.tooltip;
    setText(card.subtitle, d.subtitle);
    card.subtitle.title = d.tooltip;
    card.subtitle.hidden = !d.subtitle;
    card.error.hidden = !d.error;
    setText(card.error, d.error ? `Error reading this GPU: ${d.error}` : '');
    card.root.classList.toggle('jp-gpuctx-mod-oom', !!d.oom);
    card.oom.hidden = !d.oom;
    setText(card.oomText, d.oom?.text ?? '');
    setText(card.oomDetail, d.oom?.detail ?? '');
    if (d.oom?.kernelId) {
      setAttr(card.oom, 'data-kernel-id', d.oom.kernelId);
    } else {
      card.oom.removeAttribute('data-kernel-id');
    }
    card.idleHeldLabel.hidden = card.idleHeld.hidden = !d.idleHeldText;
    setText(card.idleHeld, d.idleHeldText ?? '');
    const util = d.utilization === null ? null : d.utilization / 100;
    updateMeter(card.util, util, d.utilizationText, d.utilizationText);
    const warning = this._memoryWarning(d);
    const spoken = warning ? `${d.memoryText}; ${warning}` : d.memoryText;
    updateMeter(card.mem, d.memoryFraction, d.memoryText, spoken, d.memoryWarn);
    card.mem.root.title = warning;
    setText(card.temperature, d.temperatureText);
    setText(card.power, d.powerText);
    const span = this._settings.historyLength;
    card.chart.update(
      this._history.points(d.key),
      span,
      this._settings.chartMemoryScale,
      `Utilisation (solid) and memory (dashed) of ${d.shortName} over the last ${formatSpan(span)}`
    );
    // Rebuilt only when who is listed, their order, or their buttons change.
    const key = d.processes.map(p => `${p.pid}:${p.kernelId}:${p.label}:${p.canRelease}:${p.canSuspend}`).join('|');
    if (key !== card.processKey) {
      card.processKey = key;
      card.processes.replaceChildren(
        ...(d.processes.length ? d.processes.map(p => this._processItem(p)) : [el('li', 'jp-gpuctx-empty', 'none')])
      );
    }
    // Memory, state, idle time and marks change every tick; they are refreshed in place.
    d.processes.forEach((p, i) => {
      const item = card.processes.children[i] as HTMLElement | undefined;
      if (item) {
        this._updateProcessItem(item, p);
      }
    });
    const suspendedKey = JSON.stringify(d.suspended);
    if (suspendedKey !== card.suspendedKey) {
      card.suspendedKey = suspendedKey;
      card.suspendedHeading.hidden = card.suspended.hidden = d.suspended.length === 0;
      card.suspended.replaceChildren(...d.suspended.map(s => this._suspendedItem(s)));
    }
  }

  private _suspendedItem(s: ISuspendedView): HTMLElement {
    const item = el('li', 'jp-gpuctx-process jp-gpuctx-suspended-item');
    item.dataset.kernelId = s.kernelId;
    item.title = s.description;
    const line = el('div', 'jp-gpuctx-process-line');
    line.append(
      el('span', 'jp-gpuctx-process-label', s.label),
      el('span', 'jp-gpuctx-badge jp-gpuctx-badge-suspended', s.text)
    );
    const actions = el('div', 'jp-gpuctx-actions');
    actions.append(...this._actionButtons(s.kernelId, s.label, { holder: false, suspendable: false, suspended: true }));
    item.append(line, actions);
    return item;
  }

  private _processItem(p: IProcessView): HTMLElement {
    const item = el('li', 'jp-gpuctx-process');
    item.dataset.pid = String(p.pid);
    if (p.kernelId) {
      item.dataset.kernelId = p.kernelId;
    }
    const line = el('div', 'jp-gpuctx-process-line');
    line.append(
      el('span', 'jp-gpuctx-process-label', p.label),
      el('span', 'jp-gpuctx-process-state'),
      el('span', 'jp-gpuctx-process-memory')
    );
    // What the kernel does with its memory: idle time, allocator figures, and marks in words
    // (never colour alone).
    const facts = el('div', 'jp-gpuctx-process-facts');
    facts.append(
      el('span', 'jp-gpuctx-badge jp-gpuctx-badge-oom', 'ran out of memory'),
      el('span', 'jp-gpuctx-badge jp-gpuctx-badge-idle-holder', IDLE_HOLDER_TEXT),
      el('span', 'jp-gpuctx-badge jp-gpuctx-badge-cull'),
      el('span', 'jp-gpuctx-process-idle'),
      el('span', 'jp-gpuctx-process-allocator')
    );
    item.append(line, facts);
    if (p.kernelId) {
      const actions = el('div', 'jp-gpuctx-actions');
      actions.append(
        ...this._actionButtons(p.kernelId, p.label, { holder: p.canRelease, suspendable: p.canSuspend, suspended: false })
      );
      item.appendChild(actions);
    }
    this._updateProcessItem(item, p);
    return item;
  }

  private _updateProcessItem(item: HTMLElement, p: IProcessView): void {
    if (item.title !== p.description) {
      item.title = p.description;
    }
    item.classList.toggle('jp-gpuctx-standby', p.standby);
    item.classList.toggle('jp-gpuctx-idle-holder', p.idleHolder);
    item.classList.toggle('jp-gpuctx-cull-warning', p.cullWarning);
    item.classList.toggle('jp-gpuctx-oom-holder', p.oom === 'holder');
    item.classList.toggle('jp-gpuctx-oom-failing', p.oom === 'failing');
    const part = (cls: string, text: string | null) => {
      const node = item.querySelector(`.${cls}`) as HTMLElement | null;
      if (node) {
        setText(node, text ?? '');
        node.hidden = !text;
      }
    };
    part('jp-gpuctx-process-state', p.executionState);
    part('jp-gpuctx-process-memory', p.memory);
    part('jp-gpuctx-badge-oom', p.oom === 'failing' ? 'ran out of memory' : null);
    part('jp-gpuctx-badge-idle-holder', p.idleHolder ? IDLE_HOLDER_TEXT : null);
    part('jp-gpuctx-badge-cull', p.cullText);
    part('jp-gpuctx-process-idle', p.idleText);
    part('jp-gpuctx-process-allocator', p.allocatorText);
    const facts = item.querySelector('.jp-gpuctx-process-facts') as HTMLElement | null;
    if (facts) {
      facts.hidden = !(p.oom === 'failing' || p.idleHolder || p.cullText || p.idleText || p.allocatorText);
    }
  }

  // ---- compact rows ----

  private _renderRowsCompact(devices: IDeviceView[]): void {
    const seen = new Set<string>();
    devices.forEach((device, i) => {
      seen.add(device.key);
      let row = this._rows.get(device.key);
      if (!row) {
        row = this._createRow(device.key);
        this._rows.set(device.key, row);
      }
      if (this._compactNode.children[i] !== row.root) {
        this._compactNode.insertBefore(row.root, this._compactNode.children[i] ?? null);
      }
      this._updateRow(row, device);
    });
    for (const [key, row] of Array.from(this._rows)) {
      if (!seen.has(key)) {
        row.root.remove();
        this._rows.delete(key);
      }
    }
  }

  private _createRow(key: string): IRow {
    const root = el('li', 'jp-gpuctx-compact-row');
    root.dataset.gpuctxDevice = key;
    const name = el('span', 'jp-gpuctx-compact-name');
    const util = createMeter('utilization', 'Utilisation');
    const mem = createMeter('memory', 'Memory');
    const top = el('span', 'jp-gpuctx-compact-top');
    const oom = el('span', 'jp-gpuctx-compact-oom');
    oom.setAttribute('role', 'status');
    oom.hidden = true;
    root.append(name, util.root, mem.root, top, oom);
    return { root, name, util, mem, top, oom };
  }

  private _updateRow(row: IRow, d: IDeviceView): void {
    setText(row.name, d.shortName);
    row.root.title = d.tooltip;
    row.root.classList.toggle('jp-gpuctx-mod-error', !!d.error);
    const util = d.utilization === null ? null : d.utilization / 100;
    updateMeter(row.util, util, d.utilizationText, `${d.shortName} utilisation ${d.utilizationText}`);
    const warning = this._memoryWarning(d);
    const spoken = `${d.shortName} memory ${d.memoryText}${warning ? `; ${warning}` : ''}`;
    updateMeter(row.mem, d.memoryFraction, d.memoryUsedText, spoken, d.memoryWarn);
    row.mem.root.title = warning || d.memoryText;
    const t = d.top;
    const top = d.error
      ? `Error: ${d.error}`
      : t
        ? [t.label, t.memory, t.idleHolder ? IDLE_HOLDER_TEXT : null, t.idleText, t.allocatorText]
            .filter(Boolean)
            .join(' · ') + (d.processes.length > 1 ? ` (+${d.processes.length - 1})` : '')
        : 'no processes';
    const away = d.suspended.length ? ` · ${d.suspended.map(x => `${x.label} ${x.text}`).join('; ')}` : '';
    setText(row.top, top + away);
    row.top.title = t ? t.description : '';
    row.top.classList.toggle('jp-gpuctx-idle-holder', !d.error && !!t?.idleHolder);
    row.top.classList.toggle('jp-gpuctx-cull-warning', !d.error && !!t?.cullWarning);
    row.root.classList.toggle('jp-gpuctx-mod-oom', !!d.oom);
    row.oom.hidden = !d.oom;
    setText(row.oom, d.oom?.text ?? '');
    row.oom.title = d.oom?.detail ?? '';
  }

  private _settings: IGpuSettings = DEFAULT_SETTINGS;
  private _snapshot: ISnapshot | null = null;
  private _compactChoice: boolean | null = null;
  private _deviceCount = 0;
  private _compactToggle: HTMLButtonElement;
  private _connection: HTMLElement;
  private _outage: HTMLElement;
  private _freshness: HTMLElement;
  private _replay: HTMLElement;
  private _replaySource: HTMLElement;
  private _replayRecorded: HTMLElement;
  private _replayDate: HTMLElement;
  private _noGpu: HTMLElement;
  private _noGpuReason: string | null = null;
  private _notebook: HTMLElement;
  private _notebookName: HTMLElement;
  private _notebookRows: HTMLElement;
  private _rowsKey = '';
  private _notebookActions: HTMLElement;
  private _actionsKey = '';
  private _notebookInfo: INotebookRef | null = null;
  private _notebookView: IKernelView | null = null;
  private _devices: HTMLElement;
  private _cardsNode: HTMLElement;
  private _compactNode: HTMLElement;
  private _notes: HTMLElement;
  private _notesKey = '';
  private _reserve: HTMLElement;
  private _reserveHeading: HTMLElement;
  private _reserveLines: HTMLElement;
  private _reserveKey = '';
  private _reclaimed: HTMLElement;
  private _reclaimedList: HTMLElement;
  private _reclaimedKey = '';
  private _cards = new Map<string, ICard>();
  private _rows = new Map<string, IRow>();
  private _visibilityChanged = new Signal<this, boolean>(this);
  private _actionRequested = new Signal<this, IActionRequest>(this);
}
