/**
 * Test-side peers: a bare gateway speaking the protocol through the TCP transport (this package's Gateway
 * class is another module's; the scenarios need only attach/detach frames), and helpers to collect an
 * observer's events.
 */

import { nodeConnector } from "../../src/transport/node.js";
import { encodeBody } from "../../src/protocol/frame.js";
import type { PresenceEvent, ServerMessage, SessionKey } from "../../src/protocol/messages.js";
import type { Transport } from "../../src/transport/transport.js";
import type { Observer } from "../../src/observer.js";
import type { Link } from "../../src/link.js";

/** A gateway login on its own connection: `attach`, `detach`, and `sync()` (a ping's pong: all applied). */
export class RawGateway {
  private pongs: Array<() => void> = [];
  closed = false;

  private constructor(readonly transport: Transport) {
    transport.onMessage = (m: ServerMessage) => {
      if (m.op === "pong") this.pongs.shift()?.();
    };
    transport.onClose = () => {
      this.closed = true;
    };
  }

  static async login(address: string, name: string, token?: string): Promise<RawGateway> {
    const transport = await nodeConnector()(address);
    const welcome = new Promise<ServerMessage>((resolve) => { transport.onMessage = resolve; });
    transport.send(encodeBody({ op: "login", gateway: name, ...(token ? { token } : {}) }));
    const message = await welcome;
    if (message.op !== "welcome") throw new Error(`gateway login refused: ${JSON.stringify(message)}`);
    return new RawGateway(transport);
  }

  attach(uids: SessionKey[], keepalive = 60): void {
    for (let i = 0; i < uids.length; i += 500) {
      this.transport.send(encodeBody({ op: "attach", uids: uids.slice(i, i + 500), keepalive }));
    }
  }

  detach(uids: SessionKey[]): void {
    for (let i = 0; i < uids.length; i += 500) this.transport.send(encodeBody({ op: "detach", uids: uids.slice(i, i + 500) }));
  }

  sync(): Promise<void> {
    return new Promise((resolve) => {
      this.pongs.push(resolve);
      this.transport.send(encodeBody({ op: "ping" }));
    });
  }

  close(): void {
    this.transport.send(encodeBody({ op: "bye" }));
    this.transport.close();
  }
}

export function range(n: number, from = 0): number[] {
  return Array.from({ length: n }, (_, i) => from + i);
}

/** Events of `observer` (appended to `sink`) up to and including the first one `stop` accepts; rejects with
 * the observer's final error if it stops first, or after `timeout` seconds. */
export function collect(observer: Observer, stop: (e: PresenceEvent, all: PresenceEvent[]) => boolean,
  sink: PresenceEvent[] = [], timeout = 20): Promise<PresenceEvent[]> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`collect: not done within ${timeout} s (${sink.length} events, last seq ${sink.at(-1)?.seq})`));
    }, timeout * 1000);
    const offEvent = observer.on("event", (event) => {
      sink.push(event);
      if (stop(event, sink)) {
        cleanup();
        resolve(sink);
      }
    });
    const offClosed = observer.on("closed", ({ error }) => {
      cleanup();
      reject(error ?? new Error("the observer closed"));
    });
    const cleanup = (): void => {
      clearTimeout(timer);
      offEvent();
      offClosed();
    };
  });
}

/** Every event of `observer` appended to `sink` from now on (events are handed over as they come: a listener
 * added later misses those before it); returns `sink`. */
export function record(observer: Observer, sink: PresenceEvent[] = []): PresenceEvent[] {
  observer.on("event", (event) => sink.push(event));
  return sink;
}

export function contiguous(events: PresenceEvent[], first = 1): boolean {
  return events.every((e, i) => e.seq === first + i);
}

/** Resolves at the link's next `closed` (with its error, null after close()). */
export function closedOf(link: Link): Promise<Error | null> {
  if (link.done) return Promise.resolve(link.error);
  return new Promise((resolve) => link.once("closed", ({ error }) => resolve(error)));
}
