/**
 * A small typed event emitter: `on(name, listener)` returns a function that removes the listener.
 *
 * Why not EventTarget: it exists in browsers and Node alike, but its listeners take an `Event` (payloads ride
 * in a `CustomEvent.detail` cast by hand), TypeScript cannot tie an event name to its payload type without
 * boilerplate per class, and a listener that throws is reported to the global error handler in browsers but
 * can crash a Node process. This one is typed per event name, identical on both platforms, ~30 lines, and a
 * listener's exception never breaks the client's loop: it is rethrown on a fresh task (`queueMicrotask`),
 * where the platform reports it as any uncaught error.
 */

export type Listener<T> = (payload: T) => void;

export class Emitter<Events extends Record<string, unknown>> {
  private listeners: { [K in keyof Events]?: Set<Listener<Events[K]>> } = {};

  on<K extends keyof Events>(name: K, listener: Listener<Events[K]>): () => void {
    (this.listeners[name] ??= new Set()).add(listener);
    return () => this.off(name, listener);
  }

  once<K extends keyof Events>(name: K, listener: Listener<Events[K]>): () => void {
    const off = this.on(name, (payload) => {
      off();
      listener(payload);
    });
    return off;
  }

  off<K extends keyof Events>(name: K, listener: Listener<Events[K]>): void {
    this.listeners[name]?.delete(listener);
  }

  protected emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    for (const listener of [...(this.listeners[name] ?? [])]) {
      try {
        listener(payload);
      } catch (error) {
        queueMicrotask(() => {
          throw error;
        });
      }
    }
  }
}
