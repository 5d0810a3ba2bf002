/**
 * gpuctx for JupyterLab: the "GPUs" sidebar panel, the active notebook's GPU view, the GPU
 * dashboard in the main area and the status-bar item, all fed by one shared websocket to the
 * gpuctx server extension; and every notebook's cells, as they are typed, for its kernel's warm
 * plan (cells.ts).
 *
 * This file only wires JupyterLab's services to the parts: what the page knows and when it asks
 * lives in `GpuController` (controller.ts); what it shows, in `GpuPanel` and `GpuStatusItem`.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  IThemeManager,
  Notification,
  showDialog,
  showErrorMessage,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { fetchDevices, fetchKernelView, kernelAction, sendCells, streamUrl } from './api';
import { NotebookTyping } from './cells';
import { GpuController } from './controller';
import { DASHBOARD_ID, GpuDashboard } from './dashboard';
import { DeviceHistory } from './history';
import { gpuIcon } from './icon';
import { ActiveNotebook } from './notebooks';
import { GpuPanel } from './panel';
import { DEFAULT_SETTINGS, IGpuSettings, readSettings } from './settings';
import { GpuStatusItem } from './statusitem';
import { GpuStream, ISocket } from './stream';

const PLUGIN_ID = 'gpuctx-jupyterlab:plugin';
const PANEL_ID = 'gpuctx-panel';
const OPEN_COMMAND = 'gpuctx:open-panel';
const DASHBOARD_COMMAND = 'gpuctx:open-dashboard';

/** This page's connection to a kernel, if one of its notebooks is connected to it. */
function openKernel(tracker: INotebookTracker | null, kernelId: string): Kernel.IKernelConnection | null {
  let found: Kernel.IKernelConnection | null = null;
  tracker?.forEach(panel => {
    const kernel = panel.sessionContext.session?.kernel;
    if (!found && kernel && kernel.id === kernelId) {
      found = kernel;
    }
  });
  return found;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A GPU sidebar panel, a GPU dashboard and a status-bar item for the active notebook, from gpuctx.',
  autoStart: true,
  optional: [INotebookTracker, IStatusBar, ISettingRegistry, ILayoutRestorer, ICommandPalette, IThemeManager],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    statusBar: IStatusBar | null,
    registry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    themes: IThemeManager | null
  ) => {
    const server = app.serviceManager.serverSettings;
    const stream = new GpuStream({
      url: (interval, detail) => streamUrl(server, interval, detail),
      openSocket: url => new server.WebSocket(url) as unknown as ISocket,
      fetchSnapshot: () => fetchDevices(server),
      interval: DEFAULT_SETTINGS.refreshRate
    });
    const controller = new GpuController({
      stream,
      history: new DeviceHistory(DEFAULT_SETTINGS.historyLength, DEFAULT_SETTINGS.refreshRate),
      notebooks: tracker ? new ActiveNotebook(app.shell, tracker) : null,
      fetchKernelView: kernelId => fetchKernelView(server, kernelId),
      kernelAction: (kernelId, api) => {
        // A kernel this page is connected to is acted on through its own connection, as
        // JupyterLab's toolbar does: the notebook then follows a restart (status, websocket) at
        // once instead of reading "starting" until a cell runs. Others go through the GPU API.
        const kernel = openKernel(tracker, kernelId);
        if (kernel && (api === 'restart' || api === 'interrupt' || api === 'shutdown')) {
          return kernel[api]().then(() => ({ status: 'ok', kernel_id: kernelId, action: api }));
        }
        return kernelAction(server, kernelId, api);
      },
      confirm: async (wording, spec) => {
        const result = await showDialog({
          title: wording.title,
          body: wording.body,
          buttons: [
            Dialog.cancelButton(),
            spec.destructive
              ? Dialog.warnButton({ label: spec.verb, ariaLabel: wording.label })
              : Dialog.okButton({ label: spec.verb, ariaLabel: wording.label })
          ]
        });
        return result.button.accept;
      },
      reportError: (title, message) => showErrorMessage(title, message),
      notify: notice =>
        Notification.emit(notice.message, notice.type, {
          autoClose: notice.sticky ? false : 8000,
          actions: notice.showPanel
            ? [{ label: 'Show the GPU panel', callback: () => app.shell.activateById(PANEL_ID) }]
            : []
        }),
      dismiss: id => Notification.dismiss(id)
    });

    const panel = new GpuPanel(controller.history);
    panel.id = PANEL_ID;
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPUs';
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, PANEL_ID);
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the GPU panel',
      caption: 'Open the gpuctx GPU panel in the left sidebar',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'GPU' });

    // The dashboard: one per page, in the main area, restored with the layout.
    const dashboards = new WidgetTracker<GpuDashboard>({ namespace: 'gpuctx-dashboard' });
    const openDashboard = (): GpuDashboard => {
      let dashboard = dashboards.find(() => true);
      if (!dashboard || dashboard.isDisposed) {
        dashboard = new GpuDashboard(controller.history);
        dashboard.title.icon = gpuIcon;
        dashboard.openChanged.connect((_, open) => controller.setDashboardOpen(open));
        if (controller.snapshot) {
          dashboard.setSnapshot(controller.snapshot);
        }
        dashboard.setHealth(controller.health);
        void dashboards.add(dashboard);
        app.shell.add(dashboard, 'main');
      }
      app.shell.activateById(dashboard.id);
      return dashboard;
    };
    app.commands.addCommand(DASHBOARD_COMMAND, {
      label: 'Open the GPU dashboard',
      caption: 'Large GPU charts in the main area: utilisation, memory by notebook, temperature, power, links',
      icon: gpuIcon,
      execute: () => openDashboard()
    });
    palette?.addItem({ command: DASHBOARD_COMMAND, category: 'GPU' });
    void restorer?.restore(dashboards, { command: DASHBOARD_COMMAND, name: () => DASHBOARD_ID });
    panel.dashboardRequested.connect(() => openDashboard());

    const statusItem = new GpuStatusItem(dashboard =>
      dashboard ? openDashboard() : app.shell.activateById(PANEL_ID)
    );
    const renderStatus = () => statusItem.render(controller.statusView());
    const renderNotebook = () => panel.setNotebook(controller.notebook, controller.kernelView);

    controller.snapshotChanged.connect((_, snapshot) => {
      panel.setSnapshot(snapshot);
      dashboards.forEach(d => d.setSnapshot(snapshot));
      renderStatus();
    });
    controller.historyChanged.connect(() => {
      // the server's last minutes: drawn at once, not at the next snapshot
      if (controller.snapshot) {
        panel.setSnapshot(controller.snapshot);
        dashboards.forEach(d => d.setSnapshot(controller.snapshot!));
      }
    });
    controller.notebookChanged.connect(() => {
      renderNotebook();
      renderStatus();
    });
    controller.healthChanged.connect((_, health) => {
      panel.setHealth(health);
      dashboards.forEach(d => d.setHealth(health));
      renderStatus();
    });
    panel.visibilityChanged.connect((_, visible) => controller.setPanelVisible(visible));
    statusItem.visibilityChanged.connect((_, visible) => controller.setStatusVisible(visible));
    // A page in a background tab shows nothing: its stream goes after a grace period (stream.ts).
    document.addEventListener('visibilitychange', () => stream.setPageHidden(document.hidden));
    stream.setPageHidden(document.hidden);
    panel.actionRequested.connect((_, request) => void controller.runAction(request));
    themes?.themeChanged.connect(() =>
      requestAnimationFrame(() => {
        panel.redrawCharts();
        dashboards.forEach(d => d.redrawCharts());
      })
    );

    if (statusBar && tracker) {
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item: statusItem,
        align: 'left',
        rank: 5,
        isActive: () => controller.statusShown,
        activeStateChanged: controller.statusShownChanged
      });
    }

    // Every open notebook's cells as they are typed, to its kernel's warm plan: once per
    // document, however many views show it.
    const typing = new NotebookTyping({
      send: (kernelId, sources) => sendCells(server, kernelId, sources),
      enabled: DEFAULT_SETTINGS.warmTypedCells
    });
    tracker?.forEach(nb => typing.watch(nb));
    tracker?.widgetAdded.connect((_, nb) => typing.watch(nb));

    const apply = (settings: IGpuSettings) => {
      panel.configure(settings);
      controller.configure(settings);
      typing.enabled = settings.warmTypedCells;
      renderStatus();
    };
    apply(DEFAULT_SETTINGS);
    registry
      ?.load(PLUGIN_ID)
      .then(loaded => {
        const read = () => apply(readSettings(key => loaded.get(key).composite));
        read();
        loaded.changed.connect(read);
      })
      .catch(reason => console.warn('gpuctx: could not load its settings, using the defaults.', reason));
    renderNotebook();
    panel.setHealth(controller.health);
  }
};

export default plugin;
