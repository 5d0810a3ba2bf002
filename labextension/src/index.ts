/**
 * gpuctx for JupyterLab: the "GPUs" sidebar panel, the active notebook's GPU view and the
 * status-bar item, all fed by one shared websocket to the gpuctx server extension.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';

import { fetchDevices, fetchKernelView, kernelAction, streamUrl } from './api';
import { DeviceHistory } from './history';
import { gpuIcon } from './icon';
import { isReplay, statusDescription, statusText } from './model';
import { GpuPanel, IActionRequest, INotebookInfo } from './panel';
import { GpuStatusItem } from './statusitem';
import { GpuStream, ISocket } from './stream';
import { IKernelView, ISnapshot, KernelAction } from './types';
import { memoryFraction } from './format';

const PLUGIN_ID = 'gpuctx-jupyterlab:plugin';
const PANEL_ID = 'gpuctx-panel';
const OPEN_COMMAND = 'gpuctx:open-panel';
/** The kernel's own view is asked over its control channel: not more often than this (ms). */
const KERNEL_VIEW_PERIOD = 5000;

interface ISettings {
  refreshRate: number;
  historyLength: number;
  showStatusBar: boolean;
}

const DEFAULTS: ISettings = { refreshRate: 1, historyLength: 120, showStatusBar: true };

const VERBS: Record<KernelAction, { verb: string; warning: string }> = {
  interrupt: { verb: 'Interrupt', warning: 'The running cell stops with KeyboardInterrupt.' },
  restart: { verb: 'Restart', warning: 'All variables are lost and its GPU memory is released.' },
  shutdown: { verb: 'Shut down', warning: 'All variables are lost and its GPU memory is released.' }
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A GPU sidebar panel and a status-bar item for the active notebook, from gpuctx.',
  autoStart: true,
  optional: [INotebookTracker, IStatusBar, ISettingRegistry, ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    statusBar: IStatusBar | null,
    registry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const server = app.serviceManager.serverSettings;
    let settings = { ...DEFAULTS };
    const history = new DeviceHistory(settings.historyLength, settings.refreshRate);
    const stream = new GpuStream({
      url: interval => streamUrl(server, interval),
      openSocket: url => new server.WebSocket(url) as unknown as ISocket,
      fetchSnapshot: () => fetchDevices(server),
      interval: settings.refreshRate
    });

    const panel = new GpuPanel(history);
    panel.id = PANEL_ID;
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPUs';
    panel.historySeconds = settings.historyLength;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, PANEL_ID);

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the GPU panel',
      caption: 'Open the gpuctx GPU panel in the left sidebar',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'GPU' });

    // ---- the active notebook and its kernel's own GPU view ----
    let kernelView: IKernelView | null = null;
    let viewKernel: string | null = null;
    let viewTimer: number | null = null;
    let viewInFlight = false;
    let panelVisible = false;

    const current = (): NotebookPanel | null => tracker?.currentWidget ?? null;
    const currentKernelId = (): string | null => current()?.sessionContext.session?.kernel?.id ?? null;
    const notebookInfo = (): INotebookInfo | null => {
      const nb = current();
      if (!nb) {
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
    };

    const statusItem = new GpuStatusItem(() => app.shell.activateById(PANEL_ID));
    const statusActive = new Signal<unknown, void>(statusItem);
    const statusShown = () => settings.showStatusBar && current() !== null;
    const renderStatus = () => {
      const snap = stream.snapshot;
      const kernelId = currentKernelId();
      statusItem.setText(
        statusText(snap, kernelId, kernelView),
        statusDescription(snap, kernelId, kernelView),
        isReplay(snap)
      );
    };
    const renderNotebook = () => panel.setNotebook(notebookInfo(), kernelView);

    const needKernelView = () => currentKernelId() !== null && (panelVisible || statusShown());
    const scheduleKernelView = (delay: number) => {
      if (viewTimer !== null) {
        window.clearTimeout(viewTimer);
      }
      viewTimer = needKernelView() ? window.setTimeout(() => void refreshKernelView(), delay) : null;
    };
    const refreshKernelView = async () => {
      viewTimer = null;
      const kernelId = currentKernelId();
      if (!kernelId || viewInFlight || !needKernelView()) {
        return;
      }
      viewInFlight = true;
      let answer: IKernelView;
      try {
        answer = await fetchKernelView(server, kernelId);
      } catch (err) {
        const reason = err instanceof ServerConnection.ResponseError ? err.message : String(err);
        answer = { status: 'error', reason };
      } finally {
        viewInFlight = false;
      }
      if (currentKernelId() === kernelId) {
        kernelView = answer;
        viewKernel = kernelId;
        renderNotebook();
        renderStatus();
      }
      scheduleKernelView(KERNEL_VIEW_PERIOD);
    };

    const updateDemand = () => {
      stream.demand('panel', panelVisible);
      stream.demand('statusbar', statusShown());
      statusActive.emit();
      scheduleKernelView(0);
    };

    const onNotebookChanged = () => {
      const kernelId = currentKernelId();
      if (kernelId !== viewKernel) {
        kernelView = null;
        viewKernel = kernelId;
        scheduleKernelView(0);
      }
      renderNotebook();
      renderStatus();
    };

    if (tracker) {
      const watched = new WeakSet<NotebookPanel>();
      const watch = (nb: NotebookPanel | null) => {
        if (!nb || watched.has(nb)) {
          return;
        }
        watched.add(nb);
        const changed = () => {
          if (nb === current()) {
            onNotebookChanged();
          }
        };
        nb.sessionContext.kernelChanged.connect(changed);
        nb.sessionContext.statusChanged.connect(changed);
        nb.sessionContext.ready.then(changed).catch(() => undefined);
        nb.context.pathChanged.connect(changed);
      };
      tracker.currentChanged.connect((_, nb) => {
        watch(nb);
        onNotebookChanged();
        updateDemand();
      });
      tracker.widgetAdded.connect((_, nb) => watch(nb));
      watch(tracker.currentWidget);
    }

    // ---- the stream ----
    stream.snapshotChanged.connect((_, snapshot: ISnapshot) => {
      for (const d of snapshot.devices ?? []) {
        history.add(d.uuid || `cuda:${d.ordinal}`, {
          t: snapshot.time,
          utilization: typeof d.utilization === 'number' ? d.utilization : null,
          memory: memoryFraction(d.memory_used, d.memory_total)
        });
      }
      history.retain((snapshot.devices ?? []).map(d => d.uuid || `cuda:${d.ordinal}`));
      panel.setSnapshot(snapshot);
      renderStatus();
    });
    stream.stateChanged.connect((_, state) => panel.setConnection(state, stream.attempts));
    panel.visibilityChanged.connect((_, visible) => {
      panelVisible = visible;
      updateDemand();
    });

    // ---- kernel actions, confirmed first ----
    panel.actionRequested.connect((_, request: IActionRequest) => void runAction(request));
    const runAction = async ({ kernelId, action, label }: IActionRequest) => {
      const { verb, warning } = VERBS[action];
      const result = await showDialog({
        title: `${verb} kernel?`,
        body: `${verb} the kernel of ${label}? ${warning}`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: verb, ariaLabel: `${verb} the kernel` })]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await kernelAction(server, kernelId, action);
      } catch (err) {
        await showErrorMessage(`Could not ${verb.toLowerCase()} the kernel of ${label}`, err as Error);
      }
      kernelView = null;
      renderNotebook();
      scheduleKernelView(1000);
    };

    // ---- status bar ----
    if (statusBar && tracker) {
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item: statusItem,
        align: 'left',
        rank: 5,
        isActive: statusShown,
        activeStateChanged: statusActive
      });
    }

    // ---- settings ----
    const apply = (next: ISettings) => {
      settings = next;
      history.configure(next.historyLength, next.refreshRate);
      panel.historySeconds = next.historyLength;
      stream.setInterval(next.refreshRate);
      updateDemand();
    };
    if (registry) {
      registry
        .load(PLUGIN_ID)
        .then(loaded => {
          const read = () =>
            apply({
              refreshRate: (loaded.get('refreshRate').composite as number) ?? DEFAULTS.refreshRate,
              historyLength: (loaded.get('historyLength').composite as number) ?? DEFAULTS.historyLength,
              showStatusBar: (loaded.get('showStatusBar').composite as boolean) ?? DEFAULTS.showStatusBar
            });
          read();
          loaded.changed.connect(read);
        })
        .catch(reason => console.warn('gpuctx: could not load its settings, using the defaults.', reason));
    }
    renderNotebook();
    renderStatus();
    updateDemand();
  }
};

export default plugin;
