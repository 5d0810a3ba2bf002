/**
 * The "GPUs" sidebar panel: the no-GPU reason first when there is one, the active notebook's
 * own GPU view with its kernel's actions, then one card per GPU (meters, a chart of the last
 * minutes, the processes on it) — or, with many GPUs, one compact row per GPU — and under them
 * the warm reserve (the standby kernels the server keeps ready) when the server keeps one.
 *
 * The header stays in view while the panel scrolls: its one line says whether the data is live,
 * a replay, stale (for how long) or offline, the same state the status bar and the dashboard say.
 *
 * Plain DOM, updated in place: a card is built once per GPU and only its numbers change on
 * each tick, so a button that has keyboard focus keeps it while the data streams in, and a
 * screen reader is not handed the same banner again every second.
 */
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { actionSpec, actionWording, IKernelActionSpec, IOfferContext, KERNEL_ACTIONS, offered } from './actions';
import { HistoryChart } from './chart';
import { IActionRequest, IHealth, INotebookRef } from './controller';
import { formatPercent, formatSpan } from './format';
import { DeviceHistory, gapAfter } from './history';
import {
  connectionView,
  IConnectionView,
  IDeviceView,
  IDLE_HOLDER_TEXT,
  IKernelRow,
  IPanelView,
  IProcessView,
  IReserveView,
  ISuspendedView,
  kernelRows,
  notebookActions,
  panelView,
  warnFraction
} from './model';
import { DEFAULT_SETTINGS, IGpuSettings } from './settings';
import { ShownWidget } from './shown';
import { IKernelView, ISnapshot, KernelAction } from './types';

/** An element with a class and a text: the DOM here is built from these. */
export function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
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

/**
 * Keep `container`'s children in the order of `items`, one node per key: a node is made the
 * first time its key is seen, updated in place after, and removed once its key is gone.
 */
export function syncKeyed<I extends { key: string }, N extends { root: HTMLElement }>(
  container: HTMLElement,
  nodes: Map<string, N>,
  items: I[],
  make: (key: string) => N,
  update: (node: N, item: I) => void,
  remove: (node: N) => void = node => node.root.remove()
): void {
  const seen = new Set<string>();
  items.forEach((item, i) => {
    seen.add(item.key);
    let node = nodes.get(item.key);
    if (!node) {
      node = make(item.key);
      nodes.set(item.key, node);
    }
    if (container.children[i] !== node.root) {
      container.insertBefore(node.root, container.children[i] ?? null);
    }
    update(node, item);
  });
  for (const [key, node] of Array.from(nodes)) {
    if (!seen.has(key)) {
      remove(node);
      nodes.delete(key);
    }
  }
}

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
  model: HTMLElement;
  util: IMeter;
  mem: IMeter;
  facts: HTMLElement;
  top: HTMLElement;
  oom: HTMLElement;
}

/** The header's state line: what a person reads, and what a screen reader is told once. */
interface IStateLine {
  root: HTMLElement;
  text: HTMLElement;
  spoken: HTMLElement;
  detail: HTMLElement;
}

export function createStateLine(): IStateLine {
  const root = el('div', 'jp-gpuctx-state');
  const text = el('span', 'jp-gpuctx-state-text');
  text.setAttribute('aria-hidden', 'true'); // its running count ("for 12 s") would be read every second
  const spoken = el('span', 'jp-gpuctx-visually-hidden');
  spoken.id = `jp-gpuctx-state-${++uid}`;
  spoken.setAttribute('role', 'status');
  const detail = el('span', 'jp-gpuctx-state-detail');
  detail.hidden = true;
  root.append(text, spoken, detail);
  return { root, text, spoken, detail };
}

/** `source`: the replayed trace's full path, shown as the detail's tooltip. */
export function updateStateLine(line: IStateLine, state: IConnectionView, source: string | null): void {
  line.root.dataset.state = state.kind;
  line.root.classList.toggle('jp-gpuctx-replay', !!state.detail);
  setText(line.text, state.text);
  setText(line.spoken, [state.spoken, state.detail].filter(Boolean).join('. '));
  line.detail.hidden = !state.detail;
  setText(line.detail, state.detail ?? '');
  if (source) {
    setAttr(line.detail, 'title', source);
  }
}

export class GpuPanel extends ShownWidget {
  constructor(private _history: DeviceHistory) {
    super();
    this.addClass('jp-gpuctx-panel');
    this.node.setAttribute('aria-label', 'GPU panel');

    // The header stays in view while the panel scrolls: the state of the data is always seen.
    const header = el('div', 'jp-gpuctx-header');
    const top = el('div', 'jp-gpuctx-header-row');
    top.appendChild(el('h2', 'jp-gpuctx-heading', 'GPUs'));
    this._dashboardButton = el('button', 'jp-gpuctx-button jp-gpuctx-dashboard-button', 'Dashboard');
    this._dashboardButton.type = 'button';
    this._dashboardButton.title = 'Open the GPU dashboard in the main area: large charts over 2 min, 10 min or 1 h';
    this._dashboardButton.addEventListener('click', () => this._dashboardRequested.emit());
    top.appendChild(this._dashboardButton);
    this._compactToggle = el('button', 'jp-gpuctx-button jp-gpuctx-compact-toggle', 'Compact');
    this._compactToggle.type = 'button';
    this._compactToggle.title = 'One row per GPU';
    this._compactToggle.setAttribute('aria-pressed', 'false');
    this._compactToggle.hidden = true;
    this._compactToggle.addEventListener('click', () => this.setCompact(!this.compact));
    top.appendChild(this._compactToggle);
    header.appendChild(top);
    this._state = createStateLine();
    header.appendChild(this._state.root);
    this.node.appendChild(header);

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

  /** A kernel action asked for by a button; the owner confirms it and calls the server. */
  get actionRequested(): ISignal<this, IActionRequest> {
    return this._actionRequested;
  }

  /** The header's Dashboard button was pressed. */
  get dashboardRequested(): ISignal<this, void> {
    return this._dashboardRequested;
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

  /** The state of the data: the header's line, dimmed cards while stale, actions only while it answers. */
  setHealth(health: IHealth): void {
    this._health = health;
    updateStateLine(this._state, health.state, this._replaySource);
    this.toggleClass('jp-gpuctx-stale', health.state.down && health.lastUpdate !== null);
    if (health.state.down) {
      this._devices.setAttribute('aria-describedby', this._state.spoken.id);
    } else {
      this._devices.removeAttribute('aria-describedby');
    }
    if (this._down !== health.state.down) {
      this._down = health.state.down;
      this._rerender();
      this._renderNotebook();
    }
  }

  setSnapshot(snapshot: ISnapshot): void {
    this._snapshot = snapshot;
    this._render(panelView(snapshot, warnFraction(this._settings.memoryWarningPercent)));
    this._renderNotebook();
  }

  setNotebook(info: INotebookRef | null, view: IKernelView | null): void {
    this._notebookInfo = info;
    this._kernelView = view;
    this._renderNotebook();
  }

  private _renderNotebook(): void {
    const info = this._notebookInfo;
    const view = this._kernelView;
    if (!info) {
      setText(this._notebookName, 'No notebook is active.');
      this._notebookName.removeAttribute('title');
      this._renderRows([]);
      this._setActions(null, '', []);
      return;
    }
    const kernel = info.kernelId
      ? `${info.kernelName ?? 'kernel'}${info.kernelStatus ? `, ${info.kernelStatus}` : ''}`
      : 'no kernel';
    setText(this._notebookName, `${info.name} (${kernel})`);
    this._notebookName.title = info.path;
    const usage = info.kernelId ? this._snapshot?.host?.kernels?.[info.kernelId] : undefined;
    this._renderRows(info.kernelId ? kernelRows(view, usage) : []);
    const actions = notebookActions({
      kernelId: info.kernelId,
      kernelStatus: info.kernelStatus,
      view,
      snapshot: this._snapshot,
      down: this._down
    });
    this._setActions(info.kernelId, info.name, actions);
  }

  /** Redraw the charts with the theme's colours (after a theme change). */
  redrawCharts(): void {
    this._cards.forEach(card => card.chart.redraw());
  }

  protected onAfterShow(msg: Message): void {
    this._fitCharts();
    super.onAfterShow(msg); // (says it is on screen, with its charts fitted)
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
    this._replaySource = view.replay?.source ?? null;
    this.toggleClass('jp-gpuctx-mod-replay', !!view.replay);
    updateStateLine(this._state, this._health.state, this._replaySource);
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

  /** The notebook section's buttons: exactly the actions that apply now (model.notebookActions). */
  private _setActions(kernelId: string | null, label: string, actions: KernelAction[]): void {
    const key = `${kernelId}|${label}|${actions.join(',')}`;
    if (key !== this._actionsKey) {
      this._actionsKey = key;
      const specs = actions.map(actionSpec);
      this._notebookActions.replaceChildren(...(kernelId ? this._buttons(kernelId, label, specs) : []));
    }
    this._notebookActions.hidden = actions.length === 0;
  }

  /** A process row's buttons: the rows of the table that apply to it (actions.ts, `offered`). */
  private _actionButtons(kernelId: string, label: string, offer: IOfferContext): HTMLButtonElement[] {
    return this._buttons(kernelId, label, KERNEL_ACTIONS.filter(spec => offered(spec, offer)));
  }

  private _buttons(kernelId: string, label: string, specs: readonly IKernelActionSpec[]): HTMLButtonElement[] {
    return specs.map(({ action, verb }) => {
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
    syncKeyed(this._cardsNode, this._cards, devices, key => this._createCard(key), (card, d) => this._updateCard(card, d),
      card => {
        card.chart.dispose();
        card.root.remove();
      });
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
      `Utilisation (solid) and memory (dashed) of ${d.shortName} over the last ${formatSpan(span)}`,
      gapAfter(this._settings.refreshRate)
    );
    // Rebuilt only when who is listed, their order, or their buttons change.
    const key =
      `${this._down}|` +
      d.processes
        .map(p => `${p.pid}:${p.kernelId}:${p.label}:${p.canRelease}:${p.canSuspend}:${p.executionState === 'dead'}`)
        .join('|');
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
    const suspendedKey = `${this._down}|${JSON.stringify(d.suspended)}`;
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
    item.append(line);
    if (!this._down) {
      const actions = el('div', 'jp-gpuctx-actions');
      actions.append(...this._actionButtons(s.kernelId, s.label, { holder: false, suspendable: false, suspended: true }));
      item.append(actions);
    }
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
      el('span', 'jp-gpuctx-process-allocator'),
      el('span', 'jp-gpuctx-process-host')
    );
    item.append(line, facts);
    // No actions while the server does not answer, nor for a kernel that is dead.
    if (p.kernelId && !this._down && p.executionState !== 'dead') {
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
    part('jp-gpuctx-process-host', p.hostText && `host ${p.hostText}`);
    const facts = item.querySelector('.jp-gpuctx-process-facts') as HTMLElement | null;
    if (facts) {
      facts.hidden = !(p.oom === 'failing' || p.idleHolder || p.cullText || p.idleText || p.allocatorText || p.hostText);
    }
  }

  // ---- compact rows ----

  private _renderRowsCompact(devices: IDeviceView[]): void {
    syncKeyed(this._compactNode, this._rows, devices, key => this._createRow(key), (row, d) => this._updateRow(row, d));
  }

  /**
   * One GPU in two lines: its name, board and temperature, and the notebook holding most of it;
   * then utilisation and memory (labelled, used / total) over their bars.
   */
  private _createRow(key: string): IRow {
    const root = el('li', 'jp-gpuctx-compact-row');
    root.dataset.gpuctxDevice = key;
    const title = el('span', 'jp-gpuctx-compact-title');
    const name = el('span', 'jp-gpuctx-compact-name');
    const model = el('span', 'jp-gpuctx-compact-model');
    const facts = el('span', 'jp-gpuctx-compact-facts');
    title.append(name, ' ', model, ' ', facts);
    const top = el('span', 'jp-gpuctx-compact-top');
    const head = el('span', 'jp-gpuctx-compact-head');
    head.append(title, top);
    const util = createMeter('utilization', 'Util');
    const mem = createMeter('memory', 'Mem');
    const oom = el('span', 'jp-gpuctx-compact-oom');
    oom.setAttribute('role', 'status');
    oom.hidden = true;
    root.append(head, util.root, mem.root, oom);
    return { root, name, model, util, mem, facts, top, oom };
  }

  private _updateRow(row: IRow, d: IDeviceView): void {
    setText(row.name, d.shortName);
    setText(row.model, d.model);
    row.root.title = `${d.tooltip}\n${d.temperatureText}, ${d.powerText}`;
    row.root.classList.toggle('jp-gpuctx-mod-error', !!d.error);
    const util = d.utilization === null ? null : d.utilization / 100;
    updateMeter(row.util, util, d.utilizationText, `${d.shortName} utilisation ${d.utilizationText}`);
    const warning = this._memoryWarning(d);
    const spoken = `${d.shortName} memory ${d.memoryText}${warning ? `; ${warning}` : ''}`;
    updateMeter(row.mem, d.memoryFraction, d.memoryShortText, spoken, d.memoryWarn);
    row.mem.root.title = warning || d.memoryText;
    setText(row.facts, d.temperatureText);
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
  private _dashboardButton: HTMLButtonElement;
  private _state: IStateLine;
  private _replaySource: string | null = null;
  private _health: IHealth = {
    connection: 'idle',
    attempts: 0,
    stale: false,
    lastUpdate: null,
    outage: false,
    state: connectionView({ offline: false, staleFor: null, lastUpdate: null, hasData: false, replay: null })
  };
  private _down = false;
  private _notebookInfo: INotebookRef | null = null;
  private _kernelView: IKernelView | null = null;
  private _noGpu: HTMLElement;
  private _noGpuReason: string | null = null;
  private _notebook: HTMLElement;
  private _notebookName: HTMLElement;
  private _notebookRows: HTMLElement;
  private _rowsKey = '';
  private _notebookActions: HTMLElement;
  private _actionsKey = '';
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
  private _actionRequested = new Signal<this, IActionRequest>(this);
  private _dashboardRequested = new Signal<this, void>(this);
}
