// jsdom lacks a few browser APIs that the modules under test touch when they load.
const g = globalThis as unknown as Record<string, unknown>;

// @lumino/dragdrop (loaded by @lumino/widgets) subclasses DragEvent.
if (typeof g.MouseEvent === 'function' && typeof g.DragEvent === 'undefined') {
  g.DragEvent = class DragEvent extends (g.MouseEvent as typeof MouseEvent) {};
}

// uPlot watches the device pixel ratio through matchMedia as soon as it is imported.
if (typeof g.window !== 'undefined' && typeof g.matchMedia !== 'function') {
  g.matchMedia = (query: string) => ({
    matches: false,
    media: query,
    onchange: null,
    addEventListener: () => undefined,
    removeEventListener: () => undefined,
    addListener: () => undefined,
    removeListener: () => undefined,
    dispatchEvent: () => false
  });
}
