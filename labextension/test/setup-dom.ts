// jsdom has no DragEvent, which @lumino/dragdrop (loaded by @lumino/widgets) subclasses.
const g = globalThis as unknown as Record<string, unknown>;
if (typeof g.MouseEvent === 'function' && typeof g.DragEvent === 'undefined') {
  g.DragEvent = class DragEvent extends (g.MouseEvent as typeof MouseEvent) {};
}
