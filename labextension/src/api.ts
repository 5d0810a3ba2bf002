/** The gpuctx server's routes, through JupyterLab's own connection settings (token, XSRF). */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IHistoryMessage, IKernelView, ISnapshot } from './types';

const API = 'gpuctx/api';

async function request<T>(settings: ServerConnection.ISettings, path: string, init: RequestInit = {}): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API, path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (!response.ok) {
    throw await ServerConnection.ResponseError.create(response);
  }
  const text = await response.text();
  return (text ? JSON.parse(text) : {}) as T;
}

export function fetchDevices(settings: ServerConnection.ISettings): Promise<ISnapshot> {
  return request<ISnapshot>(settings, 'devices');
}

/** GET /gpuctx/api/history?seconds=<s>: the server's history, as the stream's first message. */
export function fetchHistory(settings: ServerConnection.ISettings, seconds: number): Promise<IHistoryMessage> {
  return request<IHistoryMessage>(settings, `history?seconds=${encodeURIComponent(String(seconds))}`);
}

export function fetchKernelView(settings: ServerConnection.ISettings, kernelId: string): Promise<IKernelView> {
  return request<IKernelView>(settings, `kernels/${encodeURIComponent(kernelId)}`);
}

/**
 * `api` is the action's route segment from actions.ts's table. A failure throws
 * `ServerConnection.ResponseError` (the server answered: `.response.status`, `.message`) or
 * `ServerConnection.NetworkError` (it did not).
 */
export function kernelAction(
  settings: ServerConnection.ISettings,
  kernelId: string,
  api: string
): Promise<{ status: string }> {
  return request(settings, `kernels/${encodeURIComponent(kernelId)}/${encodeURIComponent(api)}`, { method: 'POST' });
}

/**
 * `PUT …/kernels/<id>/cells`: the notebook's code cells as they stand, for the kernel's warm plan
 * (cells.ts). 202 (taken) and 200 (the kernel could not answer: `status` says why) resolve with
 * the answer; a refusal (400, 409, 413, …) throws `ServerConnection.ResponseError`.
 */
export function sendCells(
  settings: ServerConnection.ISettings,
  kernelId: string,
  cells: string[]
): Promise<{ status?: string }> {
  return request(settings, `kernels/${encodeURIComponent(kernelId)}/cells`, {
    method: 'PUT',
    body: JSON.stringify({ cells })
  });
}

/**
 * The stream's websocket URL, built the way @jupyterlab/services builds a kernel's: from
 * `wsUrl`, with the token appended only where the settings say a cookie will not carry it.
 */
export function streamUrl(
  settings: ServerConnection.ISettings,
  interval: number,
  detail: { history: number; throughput: boolean } = { history: 0, throughput: false }
): string {
  let url = URLExt.join(settings.wsUrl, API, 'stream') + `?interval=${encodeURIComponent(String(interval))}`;
  if (detail.history > 0) {
    url += `&history=${Math.round(detail.history)}`;
  }
  if (detail.throughput) {
    url += '&throughput=1';
  }
  if (settings.appendToken && settings.token) {
    url += `&token=${encodeURIComponent(settings.token)}`;
  }
  return url;
}
