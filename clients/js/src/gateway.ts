/**
 * A gateway (Node): one connection that reports many users' sessions to idled -- attach, touch, detach --
 * batched into few frames. The semantics of the Python `Gateway` (idled/client/gateway.py, gatewaylink.py).
 *
 * Theory of operation
 * -------------------
 * *Calls.* `attach`, `touch` and `detach` are synchronous: they check the keys (a bad one throws an
 * `IdledError` `bad_message` and records nothing), record the operation in a `GatewayBatcher`
 * (core/batcher.ts) and return. A timer sends whatever is pending `flushInterval` seconds after the oldest
 * pending operation, as frame bodies no larger than the welcome's `max_frame`; a call that finds
 * `maxPending` keys buffered sends them at once, so memory stays bounded however fast the application
 * reports. 10,000 touches of the same few thousand keys within one interval cost one or two frames, and the
 * server sees each touch at most `flushInterval` late (keep it well below the users' timeouts).
 *
 * *Connection.* The package's `Link` (link.ts) runs the loop every role shares: connect (TCP or TLS), log in
 * -- here as a gateway, `ended: true` when the application listens for notices, `marks: true` when asked --,
 * reconnect after a full-jitter backoff, follow the leader among several cores (`LeaderSearch`: a
 * `not_leader` refusal's hint at once, the backoff only between rounds), stop on a final error (`auth_failed`,
 * `bad_message`...) or `close()`: `error` keeps it, later calls throw it, `closed` is emitted. What the gateway
 * adds is in its hooks. On every welcome (`onWelcome`) the server has forgotten this gateway's sessions (they
 * went offline `gateway_lost`; a gateway with marks was kept within its grace), so before anything else is
 * sent the batcher's pending operations are replaced by attaches of every live session (`reattach`), written
 * first. While no connection is up, calls still update the live sessions and the pending operations are
 * dropped (the next welcome's re-attach covers them).
 *
 * *Notices.* `ended` frames name session keys as attached; each is matched back (by `keyId`) to the live
 * session, so the application gets its own key objects (`[uid, device]` arrays included), and an `idle` or
 * `kicked` one is forgotten (not re-attached after a reconnect); a `shutdown` one stays live. They are
 * delivered through `onEnded` and the `ended` event, in the order the server sent them.
 *
 * *Watermarks.* With `marks: true` each `mark` request is answered `marked` right after the pending batch is
 * sent: everything the application reported before the request is ahead of the answer on the same
 * connection (Node runs this handler to completion, so no call can slip in between).
 */

import { Link } from "./link.js";
import type { LinkEvents, LinkOptions } from "./link.js";
import {
  DEFAULT_FLUSH_INTERVAL, DEFAULT_MAX_PENDING, GatewayBatcher, keyId, type DetachReason,
} from "./core/batcher.js";
import { connectionLost } from "./protocol/errors.js";
import { checkName, DEFAULT_MAX_FRAME } from "./protocol/messages.js";
import type { GatewayLogin, ServerMessage, SessionKey, Welcome } from "./protocol/messages.js";
import { connectorFor, type NodeConnectOptions } from "./platform/node.js";
import type { Transport } from "./transport/transport.js";

export type EndedCallback = (keys: SessionKey[], reason: string) => void;

export interface GatewayOptions extends LinkOptions, NodeConnectOptions {
  /** The gateway's name (1..128 UTF-8 bytes): with marks, a reconnect by the same name resumes its sessions. */
  name: string;
  /** A login token, or a function giving a fresh one for each login. */
  token?: string | (() => string);
  /** Seconds a pending operation may wait for company (default 0.05). */
  flushInterval?: number;
  /** Keys buffered before a call sends them at once (default 100,000). */
  maxPending?: number;
  /** Session-ended notices (implies `notices`). */
  onEnded?: EndedCallback;
  /** Log in with `ended: true` and emit `ended` events (default: true when `onEnded` is given). */
  notices?: boolean;
  /** Log in with `marks: true` and answer the server's watermark requests (default false). */
  marks?: boolean;
}

export interface GatewayEvents extends LinkEvents {
  /** The server ended these sessions (keys as the application attached them). */
  ended: { keys: SessionKey[]; reason: string };
}

/** A gateway connection; `openGateway(options)` creates and starts one. */
export class Gateway extends Link<GatewayEvents> {
  readonly name: string;
  readonly batch: GatewayBatcher;
  readonly flushInterval: number;
  readonly notices: boolean;
  readonly marks: boolean;
  framesSent = 0;
  /** The current connection's frame limit (the welcome's `max_frame`). */
  maxFrame = DEFAULT_MAX_FRAME;

  private readonly token: string | (() => string) | undefined;
  private timer: unknown = null;

  constructor(options: GatewayOptions) {
    super(options, connectorFor(options));
    this.name = checkName(options.name, "gateway");
    this.token = options.token;
    this.flushInterval = options.flushInterval ?? DEFAULT_FLUSH_INTERVAL;
    if (!(this.flushInterval > 0)) throw new RangeError("flushInterval must be positive");
    this.batch = new GatewayBatcher(options.maxPending ?? DEFAULT_MAX_PENDING);
    this.notices = options.notices ?? options.onEnded !== undefined;
    this.marks = options.marks ?? false;
    const onEnded = options.onEnded;
    if (onEnded !== undefined) this.on("ended", ({ keys, reason }) => onEnded(keys, reason));
  }

  /** Sessions attached through this gateway and not detached (nor ended by the server). */
  get live(): number {
    return this.batch.live.size;
  }

  // -- the application's calls -------------------------------------------------------------------------------

  /** These sessions connected through this gateway (`keepalive` seconds sets their timeout, as for users). */
  attach(keys: readonly SessionKey[], keepalive?: number): void {
    this.usable();
    this.batch.attach(keys, keepalive, this.clock.now());
    this.queued();
  }

  /** Activity from these sessions (keys as attached). */
  touch(keys: readonly SessionKey[]): void {
    this.usable();
    this.batch.touch(keys, this.clock.now());
    this.queued();
  }

  /**
   * These sessions disconnected (a user goes offline when its last session goes; `reason` as recorded). On a
   * gateway that is closed or closing this only checks the keys: its sessions end with it anyway, and a
   * socket's close handler running after the gateway's `close()` must not throw.
   */
  detach(keys: readonly SessionKey[], reason?: DetachReason): void {
    if (this.done || this.closing) {
      keys.forEach(keyId);
      return;
    }
    this.batch.detach(keys, this.clock.now(), reason);
    this.queued();
  }

  /** Send everything pending now; resolves once written (waiting for a connection while reconnecting: the
   * welcome's re-attach then carries every live session). */
  async flush(): Promise<void> {
    this.usable();
    if (this.transport !== null) this.write(this.transport);
    else await this.waitConnected();
  }

  /** Flush, then log out (`bye`: the server ends every session still attached, `gateway_lost`). */
  override async close(linger = 1): Promise<void> {
    if (this.transport !== null && !this.closing) this.write(this.transport);
    await super.close(linger);
  }

  private usable(): void {
    if (this.error !== null) throw this.error;
    if (this.done || this.closing) throw connectionLost("the gateway is closed");
  }

  private queued(): void {
    const batch = this.batch;
    const transport = this.transport;
    if (transport === null) {
      batch.discard(); // the next welcome's re-attach covers it; the live sessions are up to date
      return;
    }
    if (batch.full) this.write(transport);
    else if (this.timer === null && batch.firstPending !== undefined) {
      const delay = batch.firstPending + this.flushInterval - this.clock.now();
      this.timer = this.clock.setTimer(() => {
        this.timer = null;
        if (this.transport !== null) this.write(this.transport);
      }, Math.max(0, delay));
    }
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      this.clock.clearTimer(this.timer);
      this.timer = null;
    }
  }

  /** Write every pending operation on `transport`. */
  private write(transport: Transport): void {
    this.clearTimer();
    for (const body of this.batch.take(this.maxFrame)) {
      if (!transport.send(body)) return;
      this.framesSent++;
    }
  }

  // -- the link's hooks ----------------------------------------------------------------------------------

  protected login(): GatewayLogin {
    const login: GatewayLogin = { op: "login", gateway: this.name };
    const token = this.token;
    if (token !== undefined) login.token = typeof token === "function" ? token() : token;
    if (this.notices) login.ended = true;
    if (this.marks) login.marks = true;
    return login;
  }

  protected override onWelcome(transport: Transport, welcome: Welcome): void {
    this.maxFrame = welcome.max_frame ?? DEFAULT_MAX_FRAME;
    this.batch.reattach(this.clock.now());
    this.write(transport); // the re-attach, before anything else on this connection
  }

  protected override onMessage(message: ServerMessage): void {
    const transport = this.transport;
    if (message.op === "ended") this.notice(message.uids, message.reason);
    else if (message.op === "mark" && transport !== null) {
      this.write(transport); // everything reported before the request, ahead of the answer
      this.send({ op: "marked", t: message.t });
    }
  }

  protected override onDisconnect(): void {
    this.clearTimer();
    this.batch.discard();
  }

  protected override onDone(): void {
    this.clearTimer();
  }

  private notice(keys: SessionKey[], reason: string): void {
    const live = this.batch.live;
    const theirs: SessionKey[] = [];
    for (const key of keys) {
      let id;
      try {
        id = keyId(key);
      } catch {
        theirs.push(key); // not a key we could have attached: handed over as it came
        continue;
      }
      theirs.push(live.get(id)?.key ?? key);
      if (reason !== "shutdown") live.delete(id);
    }
    this.emit("ended", { keys: theirs, reason });
  }
}

/** A gateway, started: it connects (and reconnects) in the background; `await gw.waitConnected()` to wait. */
export function openGateway(options: GatewayOptions): Gateway {
  return new Gateway(options).start();
}
