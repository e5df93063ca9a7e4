/**
 * gpupool in JupyterLab's status bar: the workspace's GPU share and model, its utilisation and
 * the user's queued and running jobs ("GPU 0.5 H100 · 43% · 2 queued", "CPU only"), read from the
 * server extension (gpupool/lab/handlers.py) every few seconds. Clicking it opens a panel with the
 * queue view the widgets draw.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

const OPEN_QUEUE = 'gpupool:open-queue';

interface IStatus {
  label: string;
  title: string;
  refresh: number;
  error: string | null;
  cpu_only: boolean;
}

async function get(path: string): Promise<Response> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpupool', path);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new Error(`${url}: ${response.status} ${response.statusText}`);
  }
  return response;
}

/** The status-bar item: refreshes itself, on the interval the server names. */
class StatusItem extends Widget {
  private timer: number | undefined;
  private interval = 10;

  constructor(onClick: () => void) {
    super();
    this.addClass('gpupool-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.id = 'gpupool-status';
    this.node.textContent = 'GPU …';
    this.node.addEventListener('click', onClick);
    void this.update_();
  }

  private async update_(): Promise<void> {
    try {
      const s = (await (await get('status')).json()) as IStatus;
      this.node.textContent = s.label;
      this.node.title = s.title;
      this.node.dataset.cpuOnly = String(s.cpu_only);
      this.toggleClass('gpupool-status-error', !!s.error);
      this.interval = s.refresh > 0 ? s.refresh : this.interval;
    } catch (e) {
      this.node.title = `gpupool: ${e}`;
      this.addClass('gpupool-status-error');
    }
    if (!this.isDisposed) {
      this.timer = window.setTimeout(() => void this.update_(), this.interval * 1000);
    }
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }
}

/** The queue panel: the widgets' queue view and the user's jobs, refreshed while it is shown. */
class QueuePanel extends Widget {
  private timer: number | undefined;

  constructor() {
    super();
    this.addClass('gpupool-queue-content');
    this.node.textContent = 'Loading the queues…';
    void this.load();
  }

  async load(): Promise<void> {
    try {
      // our own server's HTML, rendered from autoescaped templates (gpupool/widgets/templates)
      this.node.innerHTML = await (await get('queue')).text();
    } catch (e) {
      this.node.textContent = `gpupool: ${e}`;
    }
    if (!this.isDisposed) {
      this.timer = window.setTimeout(() => void this.load(), 10000);
    }
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpupool-lab:status',
  description: 'The gpupool GPU pool in the status bar',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    let panel: MainAreaWidget<QueuePanel> | null = null;
    app.commands.addCommand(OPEN_QUEUE, {
      label: 'GPU pool: queues and your jobs',
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new MainAreaWidget({ content: new QueuePanel() });
          panel.id = 'gpupool-queue';
          panel.title.label = 'GPU queues';
          panel.title.closable = true;
        }
        if (!panel.isAttached) {
          app.shell.add(panel, 'main');
        } else {
          void panel.content.load();
        }
        app.shell.activateById(panel.id);
      }
    });
    if (statusBar) {
      const item = new StatusItem(() => void app.commands.execute(OPEN_QUEUE));
      statusBar.registerStatusItem('gpupool-lab:status', { item, align: 'left', rank: 50 });
    }
  }
};

export default plugin;
