/**
 * An observer: presence events from a seq, resumed without gap after any reconnect, watchlists, `query`.
 * The semantics of idled/client/observer.py.
 *
 * Theory of operation
 * -------------------
 * Each new event is handed to the application (`on("event", ...)`) in seq order. The position
 * (`ObserverCursor.last`, core/cursor.ts) is the seq of the last event handed over; after a dropped connection,
 * a restarted server or a `busy` the link reconnects and subscribes with `from = last + 1`: no event is missed,
 * and an event the server sends twice (overlap at the resume seam) is dropped by seq before the application
 * sees it.
 *
 * Checkpoints: an application that must not lose events across its *own* restart stores the seq of each event
 * it has fully processed and passes it as `after` when it starts again. Events after the checkpoint are then
 * delivered again -- at least once -- and it can tell duplicates by `seq <= stored`. `after: 0` reads
 * everything the server retains; no `after` starts from now. Given a checkpoint the observer reads the durable
 * view by default (`durable`: only events already in the server's event log, so nothing it sees can be erased
 * by a crash of the server); from now, the fast one.
 *
 * A connection counts as up (the backoff starts again from its shortest delay) once its subscription is
 * taken: the first frame after it that is not an error says so (an event of the replay, or the pong of the
 * ping sent after the subscribe, for when there is nothing to replay). A refused subscription (`gone`;
 * `unavailable` from a standby whose copy has not reached the seq) is a failed attempt at that core.
 *
 * Watchlists: `uids: [...]` (even empty) subscribes to the events of those uids only; `watch(uids)` and
 * `unwatch(uids)` change the list and resolve once the server applies the change (a `ping` after them,
 * answered in order). The list is kept here and sent whole on every reconnection, as `watch` messages before
 * the `subscribe` (`subscribeMessages`), so a resumed watchlist observer misses none of its uids' events.
 *
 * `query(uids)` may be called while events stream: replies come in request order, behind the events already
 * queued, so each `status` is matched to the oldest outstanding query.
 */

import { Link } from "./link.js";
import type { LinkEvents, LinkOptions } from "./link.js";
import { ObserverCursor } from "./core/cursor.js";
import { connectionLost, IdledError } from "./protocol/errors.js";
import { encodeBody as encodeMessage } from "./protocol/frame.js";
import { checkName, checkUid, DEFAULT_MAX_FRAME } from "./protocol/messages.js";
import type { ClientMessage, ObserverLogin, PresenceEvent, ServerMessage, Status, Uid, Welcome } from "./protocol/messages.js";
import type { Connector, Transport } from "./transport/transport.js";

export interface ObserverOptions extends LinkOptions {
  /** The observer's name (1..128 UTF-8 bytes). */
  name: string;
  /** An observer token (auth on): powerful, it sees every user's presence -- see docs/client-js.md. */
  token?: string | (() => string | Promise<string>);
  /** A checkpoint: deliver the events after this seq (0: all retained). Absent: from now. */
  after?: number;
  /** Only events already durable in the event log. Default: true exactly when `after` is given. */
  durable?: boolean;
  /** A watchlist (even empty): only these uids' events. Absent: every event. */
  uids?: Iterable<Uid>;
  /** Subscribe on login (default true); false for an observer that only queries. */
  subscribe?: boolean;
}

export interface ObserverEvents extends LinkEvents {
  event: PresenceEvent;
}

/** One user in the answer to `query(uids, { lastSeen: true })`. */
export interface UserStatus {
  online: boolean;
  /** Wall unix seconds of its last activity; null when the server does not know. */
  lastSeen: number | null;
  /** The devices it is online with (empty: none named, or offline). */
  devices: string[];
}

interface Reply {
  resolve: (message: Status | { op: "pong" }) => void;
  reject: (error: IdledError) => void;
}

export class Observer extends Link<ObserverEvents> {
  readonly name: string;
  readonly cursor: ObserverCursor;
  readonly subscribes: boolean;
  /** Events dropped because their seq was already delivered. */
  duplicates = 0;
  private readonly token: ObserverOptions["token"];
  private replies: Reply[] = [];
  private unsettled = false;

  constructor(options: ObserverOptions, defaultConnector?: Connector) {
    super(options, defaultConnector);
    this.name = checkName(options.name, "observer");
    this.token = options.token;
    const uids = options.uids === undefined ? null : [...options.uids].map(checkUid);
    this.cursor = new ObserverCursor(options.after ?? null, options.durable ?? null, uids);
    this.subscribes = options.subscribe ?? true;
  }

  /** Seq of the last event delivered (null: none yet, subscribed from now). */
  get position(): number | null {
    return this.cursor.last;
  }

  get durable(): boolean {
    return this.cursor.durable;
  }

  /** The uids watched (null: every event). */
  get watchlist(): Uid[] | null {
    return this.cursor.uids === null ? null : [...this.cursor.uids];
  }

  protected async login(): Promise<ObserverLogin> {
    const login: ObserverLogin = { op: "login", observer: this.name };
    const token = typeof this.token === "function" ? await this.token() : this.token;
    if (token !== undefined) login.token = token;
    return login;
  }

  /** Which of these uids are online (keys as given: 42 and "42" differ). */
  query(uids: Iterable<Uid>): Promise<Map<Uid, boolean>>;
  /** `lastSeen: true`: a `UserStatus` per uid instead (online, when last active, its devices). */
  query(uids: Iterable<Uid>, options: { lastSeen: true }): Promise<Map<Uid, UserStatus>>;
  async query(uids: Iterable<Uid>, options: { lastSeen?: boolean } = {}): Promise<Map<Uid, boolean> | Map<Uid, UserStatus>> {
    const list = [...uids].map(checkUid);
    const message: ClientMessage = options.lastSeen ? { op: "query", uids: list, last_seen: true } : { op: "query", uids: list };
    await this.waitConnected();
    const status = await this.request([message]);
    if (status.op !== "status") throw new IdledError("bad_message", "a pong answered a query");
    if (!options.lastSeen) return status.online;
    const answer = new Map<Uid, UserStatus>();
    for (const uid of list) {
      answer.set(uid, {
        online: status.online.get(uid) === true,
        lastSeen: status.last_seen?.get(uid) ?? null,
        devices: status.devices?.get(uid) ?? [],
      });
    }
    return answer;
  }

  /** Add `uids` to the watchlist; resolves once the server applies it (their events from then on come). */
  async watch(uids: Iterable<Uid>): Promise<void> {
    await this.change(this.cursor.watch([...uids].map(checkUid)));
  }

  /** Remove `uids` from the watchlist; resolves once the server applies it. */
  async unwatch(uids: Iterable<Uid>): Promise<void> {
    await this.change(this.cursor.unwatch([...uids].map(checkUid)));
  }

  private async change(messages: ClientMessage[]): Promise<void> {
    // The list changed locally first: a reconnection from here on sends it whole, so the change is confirmed
    // by a pong on whichever connection carries it.
    for (;;) {
      await this.waitConnected();
      try {
        await this.request([...messages, { op: "ping" }]);
        return;
      } catch (error) {
        if (this.done) throw error;
        messages = []; // disconnected: the next connection's subscribe carries the list; confirm there
      }
    }
  }

  /** Send `messages` (the last one answered by a `status` or `pong`) and wait for that answer. */
  private request(messages: ClientMessage[]): Promise<Status | { op: "pong" }> {
    return new Promise((resolve, reject) => {
      if (!this.connected) return reject(connectionLost("disconnected before the reply"));
      this.replies.push({ resolve, reject });
      for (const message of messages) this.send(message);
    });
  }

  protected override onWelcome(transport: Transport, welcome: Welcome): void {
    if (!this.subscribes) return;
    // A subscription the server refuses is answered with an error frame; one it takes with events (a replay)
    // or nothing: the first frame after the welcome that is not an error settles the connection, and a ping
    // after the subscription makes sure one comes. Its reply is the first in line.
    this.unsettled = true;
    this.replies.push({ resolve: () => undefined, reject: () => undefined });
    for (const message of this.cursor.subscribeMessages(welcome.max_frame ?? DEFAULT_MAX_FRAME)) {
      transport.send(encodeMessage(message));
    }
    transport.send(encodeMessage({ op: "ping" }));
  }

  protected override settlesAtWelcome(): boolean {
    return !this.subscribes;
  }

  protected override onMessage(message: ServerMessage): void {
    if (this.unsettled) {
      this.unsettled = false;
      this.settle();
    }
    if (message.op === "event") {
      if (this.cursor.accept(message)) this.emit("event", message);
      else this.duplicates += 1;
    } else if (message.op === "status" || message.op === "pong") {
      this.replies.shift()?.resolve(message);
    }
  }

  private failReplies(error: IdledError): void {
    for (const reply of this.replies.splice(0)) reply.reject(error);
  }

  protected override onDisconnect(): void {
    this.unsettled = false;
    this.failReplies(connectionLost("disconnected before the reply"));
  }

  protected override onDone(): void {
    this.failReplies(this.error ?? connectionLost("the observer is closed"));
  }
}
