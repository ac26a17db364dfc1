/**
 * A raw observer (and a raw user) on the package's transport, for the gateway's tests: presence is checked
 * through the daemon itself, not through the gateway under test. `query(uids)` asks who is online;
 * `subscribe(from)` collects events into `events`.
 */

import { encodeBody } from "../../src/protocol/frame.js";
import type { PresenceEvent, ServerMessage, Uid } from "../../src/protocol/messages.js";
import { nodeConnector } from "../../src/transport/node.js";
import type { Transport } from "../../src/transport/transport.js";
import { until } from "./daemon.js";

export class Peek {
  readonly events: PresenceEvent[] = [];
  private statuses: { resolve: (online: Map<Uid, boolean>) => void; reject: (e: Error) => void }[] = [];
  private constructor(private readonly transport: Transport) {}

  static async open(address: string, name = "peek"): Promise<Peek> {
    const transport = await nodeConnector()(address);
    const peek = new Peek(transport);
    await login(transport, { op: "login", observer: name });
    transport.onMessage = (m) => peek.received(m);
    transport.onClose = (error) => {
      for (const waiter of peek.statuses.splice(0)) waiter.reject(error);
    };
    return peek;
  }

  private received(message: ServerMessage): void {
    if (message.op === "status") this.statuses.shift()?.resolve(message.online);
    else if (message.op === "event") this.events.push(message);
  }

  /** Who of `uids` is online (asked 500 at a time: an observer's frames are limited to 4096 bytes). */
  async query(uids: Uid[]): Promise<Map<Uid, boolean>> {
    const online = new Map<Uid, boolean>();
    for (let i = 0; i < uids.length; i += 500) {
      const part = await new Promise<Map<Uid, boolean>>((resolve, reject) => {
        this.statuses.push({ resolve, reject });
        this.transport.send(encodeBody({ op: "query", uids: uids.slice(i, i + 500) }));
      });
      for (const [uid, on] of part) online.set(uid, on);
    }
    return online;
  }

  /** Query until `want` holds (the server applies a flushed batch a moment after the gateway wrote it). */
  async online(uids: Uid[], want: (online: Map<Uid, boolean>) => boolean, timeout = 10): Promise<Map<Uid, boolean>> {
    let last = new Map<Uid, boolean>();
    const limit = Date.now() + timeout * 1000;
    while (Date.now() < limit) {
      last = await this.query(uids);
      if (want(last)) return last;
      await new Promise((r) => setTimeout(r, 50));
    }
    return last;
  }

  subscribe(from?: number): void {
    this.transport.send(encodeBody(from === undefined ? { op: "subscribe" } : { op: "subscribe", from }));
  }

  async eventsUntil(condition: (events: PresenceEvent[]) => boolean, what: string, timeout = 20): Promise<PresenceEvent[]> {
    await until(() => condition(this.events), what, timeout);
    return this.events;
  }

  close(): void {
    this.transport.close();
  }
}

function login(transport: Transport, body: Parameters<typeof encodeBody>[0]): Promise<ServerMessage> {
  return new Promise((resolve, reject) => {
    transport.onMessage = (m) => (m.op === "welcome" ? resolve(m) : reject(new Error(JSON.stringify(m))));
    transport.send(encodeBody(body));
  });
}

/** A user logged in directly (its own connection), e.g. to kick a gateway's session: newest login wins. */
export async function userLogin(address: string, uid: Uid, keepalive = 30): Promise<Transport> {
  const transport = await nodeConnector()(address);
  await login(transport, { op: "login", uid, keepalive });
  return transport;
}
