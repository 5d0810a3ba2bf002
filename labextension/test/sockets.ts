/**
 * A WebSocket as the stream sees one, driven by the test as the server would: `open()`, `send()`
 * a message, `drop()` the connection. Shared by the stream's and the controller's tests.
 */
import { ISocket } from '../src/stream';

export class FakeSocket implements ISocket {
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: unknown) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  /** 0 connecting, 1 open, 3 closed: as the browser's WebSocket. */
  readyState = 0;
  closed = false;
  constructor(public url = '') {}
  close(): void {
    this.closed = true;
    this.readyState = 3;
  }
  open(): void {
    this.readyState = 1;
    this.onopen?.({});
  }
  send(msg: object): void {
    this.onmessage?.({ data: JSON.stringify(msg) });
  }
  drop(): void {
    this.readyState = 3;
    this.onclose?.({});
  }
}
