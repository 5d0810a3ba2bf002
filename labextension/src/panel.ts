/**
 * The "GPUs" sidebar panel: the active notebook's own GPU view with its kernel's actions, then
 * one card per GPU with a sparkline of the last minutes and the processes on it.
 *
 * Plain DOM, updated in place: a card is built once per GPU and only its numbers change on
 * each tick, so a button that has keyboard focus keeps it while the data streams in.
 */
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { formatSpan } from './format';
import { DeviceHistory } from './history';
import { IDeviceView, IKernelRow, IPanelView, IProcessView, kernelRows, panelView, REPLAY_BANNER } from './model';
import { createSparkline, updateSparkline } from './sparkline';
import { StreamState } from './stream';
import { IKernelView, ISnapshot, KernelAction } from './types';

/** The notebook the user is looking at, and its kernel. */
export interface INotebookInfo {
  name: string;
  path: string;
  kernelId: string | null;
  kernelName: string | null;
  kernelStatus: string | null;
}

export interface IActionRequest {
  kernelId: string;
  action: KernelAction;
  /** What the confirmation names: the notebook or process. */
  label: string;
}

const ACTIONS: { action: KernelAction; text: string; verb: string }[] = [
  { action: 'interrupt', text: 'Interrupt', verb: 'Interrupt' },
  { action: 'restart', text: 'Restart', verb: 'Restart' },
  { action: 'shutdown', text: 'Shut down', verb: 'Shut down' }
];

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

let uid = 0;

interface ICard {
  root: HTMLElement;
  title: HTMLElement;
  subtitle: HTMLElement;
  error: HTMLElement;
  utilBar: HTMLElement;
  utilFill: HTMLElement;
  utilText: HTMLElement;
  memBar: HTMLElement;
  memFill: HTMLElement;
  memText: HTMLElement;
  spark: SVGSVGElement;
  temperature: HTMLElement;
  power: HTMLElement;
  processes: HTMLElement;
  processKey: string;
}

const SPARK_W = 200;
const SPARK_H = 32;

export class GpuPanel extends Widget {
  constructor(private _history: DeviceHistory) {
    super();
    this.addClass('jp-gpuctx-panel');
    this.node.setAttribute('aria-label', 'GPU panel');

    const header = el('div', 'jp-gpuctx-header');
    header.appendChild(el('h2', 'jp-gpuctx-heading', 'GPUs'));
    this._connection = el('span', 'jp-gpuctx-connection');
    this._connection.setAttribute('role', 'status');
    header.appendChild(this._connection);
    this.node.appendChild(header);

    this._replay = el('div', 'jp-gpuctx-replay');
    this._replay.setAttribute('role', 'alert');
    this._replay.hidden = true;
    this.node.appendChild(this._replay);

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
    this._noGpu = el('p', 'jp-gpuctx-nogpu');
    this._noGpu.setAttribute('role', 'status');
    this._noGpu.textContent = 'Waiting for the gpuctx server…';
    this._devices.appendChild(this._noGpu);
    this._cardsNode = el('div', 'jp-gpuctx-cards');
    this._devices.appendChild(this._cardsNode);
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

  set historySeconds(value: number) {
    this._historySeconds = value;
  }

  setConnection(state: StreamState, attempts: number): void {
    const text: Record<StreamState, string> = {
      idle: '',
      connecting: 'connecting…',
      open: 'connected', // to the server's stream; whether the data is live, the replay banner says
      waiting: `reconnecting (attempt ${attempts})…`
    };
    this._connection.textContent = text[state];
    this._connection.dataset.state = state;
  }

  setSnapshot(snapshot: ISnapshot): void {
    const view = panelView(snapshot);
    this._renderReplay(view);
    this._noGpu.hidden = view.noGpu === null;
    this._noGpu.textContent = view.noGpu === null ? '' : `No GPU: ${view.noGpu}`;
    this._renderCards(view.devices);
    this._notes.replaceChildren(...view.notes.map(n => el('li', undefined, n)));
  }

  setNotebook(info: INotebookInfo | null, view: IKernelView | null): void {
    if (!info) {
      this._notebookName.textContent = 'No notebook is active.';
      this._notebookRows.replaceChildren();
      this._setActions(null, '', null);
      return;
    }
    const kernel = info.kernelId
      ? `${info.kernelName ?? 'kernel'}${info.kernelStatus ? `, ${info.kernelStatus}` : ''}`
      : 'no kernel';
    this._notebookName.textContent = `${info.name} (${kernel})`;
    this._notebookName.title = info.path;
    this._renderRows(info.kernelId ? kernelRows(view) : []);
    this._setActions(info.kernelId, info.name, info.kernelStatus);
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

  private _renderReplay(view: IPanelView): void {
    if (!view.replay) {
      this._replay.hidden = true;
      this._replay.replaceChildren();
      this.removeClass('jp-gpuctx-mod-replay');
      return;
    }
    this.addClass('jp-gpuctx-mod-replay');
    this._replay.hidden = false;
    const detail = [view.replay.source, view.replay.recorded && `recorded ${view.replay.recorded}`]
      .filter(Boolean)
      .join(', ');
    this._replay.replaceChildren(el('strong', undefined, REPLAY_BANNER), el('div', 'jp-gpuctx-replay-detail', detail));
  }

  private _renderRows(rows: IKernelRow[]): void {
    const nodes: HTMLElement[] = [];
    for (const row of rows) {
      nodes.push(el('dt', undefined, row.label), el('dd', undefined, row.value));
    }
    this._notebookRows.replaceChildren(...nodes);
  }

  private _setActions(kernelId: string | null, label: string, status: string | null): void {
    const key = `${kernelId}|${label}`;
    if (key !== this._actionsKey) {
      this._actionsKey = key;
      this._notebookActions.replaceChildren(
        ...(kernelId ? this._actionButtons(kernelId, label, `the kernel of ${label}`) : [])
      );
    }
    // Nothing to interrupt while the kernel is idle is still allowed: interrupt is harmless.
    const dead = status === 'dead' || status === 'unknown';
    this._notebookActions.querySelectorAll('button').forEach(b => {
      (b as HTMLButtonElement).disabled = dead && b.dataset.action !== 'restart';
    });
  }

  private _actionButtons(kernelId: string, label: string, spoken: string): HTMLButtonElement[] {
    return ACTIONS.map(({ action, text, verb }) => {
      const button = el('button', `jp-gpuctx-button jp-gpuctx-button-${action}`, text);
      button.type = 'button';
      button.dataset.action = action;
      button.setAttribute('aria-label', `${verb} ${spoken}`);
      button.title = `${verb} ${spoken}`;
      button.addEventListener('click', () => this._actionRequested.emit({ kernelId, action, label }));
      return button;
    });
  }

  private _renderCards(devices: IDeviceView[]): void {
    const seen = new Set<string>();
    devices.forEach((device, i) => {
      seen.add(device.key);
      let card = this._cards.get(device.key);
      if (!card) {
        card = this._createCard();
        this._cards.set(device.key, card);
      }
      if (this._cardsNode.children[i] !== card.root) {
        this._cardsNode.insertBefore(card.root, this._cardsNode.children[i] ?? null);
      }
      this._updateCard(card, device);
    });
    for (const [key, card] of Array.from(this._cards)) {
      if (!seen.has(key)) {
        card.root.remove();
        this._cards.delete(key);
      }
    }
  }

  private _createCard(): ICard {
    const root = el('article', 'jp-gpuctx-card');
    const title = el('h3', 'jp-gpuctx-card-title');
    title.id = `jp-gpuctx-card-${++uid}`;
    root.setAttribute('aria-labelledby', title.id);
    const subtitle = el('div', 'jp-gpuctx-card-subtitle');
    const error = el('div', 'jp-gpuctx-card-error');
    error.setAttribute('role', 'alert');
    error.hidden = true;
    const meter = (label: string) => {
      const row = el('div', 'jp-gpuctx-meter');
      row.appendChild(el('span', 'jp-gpuctx-meter-label', label));
      const bar = el('div', 'jp-gpuctx-meter-bar');
      bar.setAttribute('role', 'meter');
      bar.setAttribute('aria-valuemin', '0');
      bar.setAttribute('aria-valuemax', '100');
      bar.setAttribute('aria-label', label);
      const fill = el('div', 'jp-gpuctx-meter-fill');
      bar.appendChild(fill);
      row.appendChild(bar);
      const text = el('span', 'jp-gpuctx-meter-value');
      row.appendChild(text);
      return { row, bar, fill, text };
    };
    const util = meter('Utilisation');
    util.row.classList.add('jp-gpuctx-meter-utilization');
    const mem = meter('Memory');
    mem.row.classList.add('jp-gpuctx-meter-memory');
    const spark = createSparkline(SPARK_W, SPARK_H);
    const facts = el('dl', 'jp-gpuctx-rows');
    const temperature = el('dd');
    const power = el('dd');
    facts.append(el('dt', undefined, 'Temperature'), temperature, el('dt', undefined, 'Power'), power);
    const procHeading = el('h4', 'jp-gpuctx-processes-heading', 'Processes');
    const processes = el('ul', 'jp-gpuctx-processes');
    root.append(title, subtitle, error, util.row, mem.row, spark, facts, procHeading, processes);
    return {
      root,
      title,
      subtitle,
      error,
      utilBar: util.bar,
      utilFill: util.fill,
      utilText: util.text,
      memBar: mem.bar,
      memFill: mem.fill,
      memText: mem.text,
      spark,
      temperature,
      power,
      processes,
      processKey: ''
    };
  }

  private _updateCard(card: ICard, d: IDeviceView): void {
    card.title.textContent = d.title;
    card.subtitle.textContent = d.subtitle;
    card.error.hidden = !d.error;
    card.error.textContent = d.error ? `Error reading this GPU: ${d.error}` : '';
    const util = d.utilization ?? 0;
    card.utilFill.style.width = `${Math.min(100, Math.max(0, util))}%`;
    card.utilBar.setAttribute('aria-valuenow', String(Math.round(util)));
    card.utilBar.setAttribute('aria-valuetext', d.utilizationText);
    card.utilText.textContent = d.utilizationText;
    const mem = (d.memoryFraction ?? 0) * 100;
    card.memFill.style.width = `${mem}%`;
    card.memBar.setAttribute('aria-valuenow', String(Math.round(mem)));
    card.memBar.setAttribute('aria-valuetext', d.memoryText);
    card.memText.textContent = d.memoryText;
    card.temperature.textContent = d.temperatureText;
    card.power.textContent = d.powerText;
    const points = this._history.points(d.key);
    updateSparkline(
      card.spark,
      points,
      this._history.capacity,
      `Utilisation (solid) and memory (dashed) of cuda:${d.ordinal} over the last ${formatSpan(this._historySeconds)}`
    );
    const key = d.processes.map(p => `${p.pid}:${p.kernelId}:${p.label}`).join('|');
    if (key !== card.processKey) {
      card.processKey = key;
      card.processes.replaceChildren(
        ...(d.processes.length ? d.processes.map(p => this._processItem(p)) : [el('li', 'jp-gpuctx-empty', 'none')])
      );
    }
    // Memory and state change every tick; only they are refreshed in place.
    d.processes.forEach((p, i) => {
      const item = card.processes.children[i] as HTMLElement | undefined;
      item?.querySelector('.jp-gpuctx-process-memory')?.replaceChildren(p.memory);
      const state = item?.querySelector('.jp-gpuctx-process-state');
      if (state) {
        state.textContent = p.executionState ?? '';
      }
    });
  }

  private _processItem(p: IProcessView): HTMLElement {
    const item = el('li', 'jp-gpuctx-process');
    item.title = p.description;
    const line = el('div', 'jp-gpuctx-process-line');
    line.append(
      el('span', 'jp-gpuctx-process-label', p.label),
      el('span', 'jp-gpuctx-process-state', p.executionState ?? ''),
      el('span', 'jp-gpuctx-process-memory', p.memory)
    );
    item.appendChild(line);
    if (p.kernelId) {
      const actions = el('div', 'jp-gpuctx-actions');
      actions.append(...this._actionButtons(p.kernelId, p.label, `the kernel of ${p.label}`));
      item.appendChild(actions);
    }
    return item;
  }

  private _historySeconds = 120;
  private _connection: HTMLElement;
  private _replay: HTMLElement;
  private _notebook: HTMLElement;
  private _notebookName: HTMLElement;
  private _notebookRows: HTMLElement;
  private _notebookActions: HTMLElement;
  private _actionsKey = '';
  private _devices: HTMLElement;
  private _noGpu: HTMLElement;
  private _cardsNode: HTMLElement;
  private _notes: HTMLElement;
  private _cards = new Map<string, ICard>();
  private _visibilityChanged = new Signal<this, boolean>(this);
  private _actionRequested = new Signal<this, IActionRequest>(this);
}
