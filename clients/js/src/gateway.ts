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
 * *Connection.* `run` loops: pick a core, connect (the package's Node transport, TCP or TLS), log in as a
 * gateway (`ended: true` when the application listens for notices, `marks: true` when asked), wait for the
 * welcome. On every welcome the server has forgotten this gateway's sessions (they went offline
 * `gateway_lost`; a gateway with marks was kept within its grace), so before anything else is sent the
 * batcher's pending operations are replaced by attaches of every live session (`reattach`) and written first.
 * While no connection is up, calls still update the live sessions and the pending operations are dropped
 * (the next welcome's re-attach covers them). A lost connection, or a retryable refusal (`busy`,
 * `server_shutdown`, `unavailable`, `not_leader`...), is retried after a full-jitter backoff (attempt n waits
 * uniform(0, min(cap, base * 2^n)) s, counted from the last welcome); a final error (`auth_failed`,
 * `bad_message`...) or `close()` ends the gateway: `error` keeps it, later calls throw it, `closed` is emitted.
 *
 * *Several cores.* `host` may list several ("a:7878,b:7878" or an array). Attempts come in rounds: a failure
 * moves on at once to the core a `not_leader` refusal named (unless tried in this round) or to the next
 * untried one; the backoff is slept only when a round is over. A round starts at the last core that
 * welcomed us (after a plain restart the likeliest leader).
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

import { EventEmitter } from "node:events";
import { parseAddresses } from "./core/address.js";
import {
  DEFAULT_FLUSH_INTERVAL, DEFAULT_MAX_PENDING, GatewayBatcher, keyId, type DetachReason,
} from "./core/batcher.js";
import { connectionLost, ErrorCode, errorFrom, IdledError } from "./protocol/errors.js";
import { encodeBody } from "./protocol/frame.js";
import { checkName, DEFAULT_MAX_FRAME, DEFAULT_PORT } from "./protocol/messages.js";
import type { GatewayLogin, ServerMessage, SessionKey, Welcome } from "./protocol/messages.js";
import { nodeConnector, type NodeTransportOptions } from "./transport/node.js";
import type { Connector, Transport } from "./transport/transport.js";

export type EndedCallback = (keys: SessionKey[], reason: string) => void;

export interface GatewayOptions {
  /** The core(s): "host:port", "a:7878,b:7878", or an array; a member without a port takes `port`. */
  host: string | readonly string[];
  port?: number;
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
  /** Reconnect after a lost connection or a retryable refusal (default true). */
  reconnect?: boolean;
  /** Full-jitter backoff: base and cap in seconds (default 0.1 and 30); `random` for tests. */
  backoff?: { base?: number; cap?: number; random?: () => number };
  /** Seconds to connect and to get the welcome (default 10). */
  connectTimeout?: number;
  /** TLS for the default connector (see transport/node.ts). */
  tls?: NodeTransportOptions["tls"];
  /** Another way to connect (tests, a custom socket); default the package's TCP/TLS connector. */
  connector?: Connector;
}

export interface GatewayEvents {
  connect: [welcome: Welcome];
  disconnect: [error: IdledError];
  ended: [keys: SessionKey[], reason: string];
  closed: [error: IdledError | null];
}

function now(): number {
  return performance.now() / 1000;
}

/** A gateway connection; `openGateway(options)` creates and starts one. */
export class Gateway extends EventEmitter<GatewayEvents> {
  readonly name: string;
  readonly batch: GatewayBatcher;
  readonly flushInterval: number;
  readonly notices: boolean;
  readonly marks: boolean;
  /** The final error, once the gateway ended because of one. */
  error: IdledError | null = null;
  /** The latest retryable error (a lost connection, a refusal that was retried). */
  lastError: IdledError | null = null;
  /** Successful logins: 1 + reconnects. */
  connections = 0;
  framesSent = 0;
  /** The current connection's frame limit (the welcome's `max_frame`). */
  maxFrame = DEFAULT_MAX_FRAME;
  welcome: Welcome | null = null;
  done = false;

  private readonly options: GatewayOptions;
  private readonly cores: string[];
  private readonly connector: Connector;
  private transport: Transport | null = null; // set while welcomed (up)
  private closing = false;
  private timer: NodeJS.Timeout | null = null;
  private waiters: { resolve: () => void; reject: (e: IdledError) => void }[] = [];
  private wake: (() => void) | null = null; // cuts a backoff sleep short (close)
  private attempt: Transport | null = null; // the connection being set up

  constructor(options: GatewayOptions) {
    super();
    this.options = options;
    this.name = checkName(options.name, "gateway");
    this.cores = parseAddresses(options.host, options.port ?? DEFAULT_PORT);
    this.flushInterval = options.flushInterval ?? DEFAULT_FLUSH_INTERVAL;
    if (!(this.flushInterval > 0)) throw new RangeError("flushInterval must be positive");
    this.batch = new GatewayBatcher(options.maxPending ?? DEFAULT_MAX_PENDING);
    this.notices = options.notices ?? options.onEnded !== undefined;
    this.marks = options.marks ?? false;
    this.connector = options.connector ?? nodeConnector({ tls: options.tls ?? false, connectTimeout: options.connectTimeout ?? 10 });
    if (options.onEnded !== undefined) this.on("ended", options.onEnded);
  }

  /** Whether a connection is up (welcomed, live sessions re-attached). */
  get connected(): boolean {
    return this.transport !== null;
  }

  /** Sessions attached through this gateway and not detached (nor ended by the server). */
  get live(): number {
    return this.batch.live.size;
  }

  // -- the application's calls -------------------------------------------------------------------------------

  /** These sessions connected through this gateway (`keepalive` seconds sets their timeout, as for users). */
  attach(keys: readonly SessionKey[], keepalive?: number): void {
    this.usable();
    this.batch.attach(keys, keepalive, now());
    this.queued();
  }

  /** Activity from these sessions (keys as attached). */
  touch(keys: readonly SessionKey[]): void {
    this.usable();
    this.batch.touch(keys, now());
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
    this.batch.detach(keys, now(), reason);
    this.queued();
  }

  /** Send everything pending now; resolves once written (waiting for a connection while reconnecting). */
  async flush(): Promise<void> {
    this.usable();
    if (this.transport !== null) {
      this.send();
      return;
    }
    await this.connectedOnce(); // the welcome's re-attach carries every live session
  }

  /** Resolves once a connection is up (at once if it is); rejects with the final error if the gateway ends. */
  connectedOnce(): Promise<void> {
    if (this.transport !== null) return Promise.resolve();
    if (this.error !== null) return Promise.reject(this.error);
    if (this.done) return Promise.reject(connectionLost("the gateway is closed"));
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Flush, log out (`bye`: the server detaches every live session, `gateway_lost`), wait up to `linger` s. */
  async close(linger = 1): Promise<void> {
    if (this.closing || this.done) return;
    this.closing = true;
    this.clearTimer();
    const transport = this.transport;
    if (transport !== null) {
      this.send();
      transport.send(encodeBody({ op: "bye" }));
      const closed = new Promise<void>((resolve) => this.once("disconnect", () => resolve()));
      const timer = setTimeout(() => transport.close(), linger * 1000);
      await closed;
      clearTimeout(timer);
    } else {
      this.attempt?.close();
      this.wake?.();
    }
    if (!this.done) await new Promise<void>((resolve) => this.once("closed", () => resolve()));
  }

  private usable(): void {
    if (this.error !== null) throw this.error;
    if (this.done || this.closing) throw connectionLost("the gateway is closed");
  }

  private queued(): void {
    const batch = this.batch;
    if (this.transport === null) {
      batch.discard(); // reattach on the next welcome covers it; the live sessions are up to date
      return;
    }
    if (batch.full) this.send();
    else if (this.timer === null && batch.firstPending !== undefined) {
      const delay = Math.max(0, batch.firstPending + this.flushInterval - now());
      this.timer = setTimeout(() => {
        this.timer = null;
        this.send();
      }, delay * 1000);
    }
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Write every pending operation on the current connection. */
  private send(): void {
    this.clearTimer();
    const transport = this.transport;
    if (transport === null) return;
    for (const body of this.batch.take(this.maxFrame)) {
      if (!transport.send(body)) return;
      this.framesSent++;
    }
  }

  // -- the connection loop ---------------------------------------------------------------------------------

  /** Connect, log in and serve until `close()` or a final error (started by `openGateway`). */
  async run(): Promise<void> {
    const backoff = this.options.backoff ?? {};
    const base = backoff.base ?? 0.1;
    const cap = backoff.cap ?? 30;
    const random = backoff.random ?? Math.random;
    const cores = this.cores;
    let failedRounds = 0; // since the last welcome
    let leader = 0; // the core that last welcomed us
    let target = 0;
    const tried = new Set<number>();
    try {
      while (!this.closing) {
        const { welcomed, error } = await this.connection(cores[target]!);
        if (this.closing) return;
        const hint = error.leader === undefined ? -1 : cores.indexOf(this.normal(error.leader));
        tried.add(target);
        if (welcomed) {
          leader = target;
          failedRounds = 0;
          tried.clear();
        } else {
          // Another core left in this round: at once, no backoff (even without reconnects: one round is
          // one attempt); the hint first, unless tried already (two stale cores must not ping-pong).
          let next = hint >= 0 && !tried.has(hint) ? hint : -1;
          for (let k = 1; next < 0 && k < cores.length; k++) {
            const i = (target + k) % cores.length;
            if (!tried.has(i)) next = i;
          }
          if (next >= 0 && (error.retryable || this.retryable(error))) {
            this.lastError = error;
            target = next;
            continue;
          }
        }
        if (!this.retryable(error)) throw error;
        this.lastError = error;
        tried.clear();
        target = hint >= 0 ? hint : leader;
        const delay = random() * Math.min(cap, base * 2 ** Math.min(failedRounds, 62));
        failedRounds++;
        await this.sleep(delay);
      }
    } catch (exc) {
      this.error = exc instanceof IdledError ? exc : connectionLost(String(exc));
    } finally {
      this.finish();
    }
  }

  private normal(address: string): string {
    try {
      return parseAddresses(address, DEFAULT_PORT)[0]!;
    } catch {
      return address; // a hint we cannot read is no hint
    }
  }

  private retryable(error: IdledError): boolean {
    return (this.options.reconnect ?? true) && error.retryable;
  }

  private sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, seconds * 1000);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.wake = () => {
        this.wake = null;
        done();
      };
    });
  }

  private login(): GatewayLogin {
    const login: GatewayLogin = { op: "login", gateway: this.name };
    const token = this.options.token;
    if (token !== undefined) login.token = typeof token === "function" ? token() : token;
    if (this.notices) login.ended = true;
    if (this.marks) login.marks = true;
    return login;
  }

  /** One connection: connect, log in, serve until it ends; whether it was welcomed, and why it ended. */
  private async connection(address: string): Promise<{ welcomed: boolean; error: IdledError }> {
    let transport: Transport;
    try {
      transport = await this.connector(address);
    } catch (exc) {
      return { welcomed: false, error: exc instanceof IdledError ? exc : connectionLost(String(exc)) };
    }
    if (this.closing) {
      transport.close();
      return { welcomed: false, error: connectionLost("the gateway is closed") };
    }
    this.attempt = transport;
    let welcomed = false;
    const limit = this.options.connectTimeout ?? 10;
    try {
      return await new Promise((resolve) => {
        let final: IdledError | null = null; // an error frame: why the server closes
        const timer = setTimeout(() => {
          final = connectionLost(`no welcome from ${address} within ${limit} s`);
          transport.close();
        }, limit * 1000);
        transport.onClose = (error) => {
          clearTimeout(timer);
          this.down(transport, final ?? error);
          resolve({ welcomed, error: final ?? error });
        };
        transport.onMessage = (message: ServerMessage) => {
          if (message.op === "error") {
            final = errorFrom(message.code, message.reason, message.leader);
            transport.close();
          } else if (welcomed) {
            this.message(transport, message);
          } else if (message.op === "welcome") {
            clearTimeout(timer);
            welcomed = true;
            this.up(transport, message);
          } else {
            final = new IdledError(ErrorCode.BAD_MESSAGE, `expected welcome, got ${message.op}`);
            transport.close();
          }
        };
        transport.send(encodeBody(this.login()));
      });
    } finally {
      this.attempt = null;
    }
  }

  private up(transport: Transport, welcome: Welcome): void {
    this.welcome = welcome;
    this.maxFrame = welcome.max_frame ?? DEFAULT_MAX_FRAME;
    this.connections++;
    this.batch.reattach(now());
    this.transport = transport;
    this.send(); // the re-attach, before anything else on this connection
    for (const waiter of this.waiters.splice(0)) waiter.resolve();
    this.emit("connect", welcome);
  }

  private down(transport: Transport, error: IdledError): void {
    if (this.transport !== transport) return;
    this.transport = null;
    this.clearTimer();
    this.batch.discard();
    this.emit("disconnect", error);
  }

  private message(transport: Transport, message: ServerMessage): void {
    if (message.op === "ended") this.ended(message.uids, message.reason);
    else if (message.op === "mark") {
      this.send(); // everything reported before the request, ahead of the answer
      transport.send(encodeBody({ op: "marked", t: message.t }));
    }
  }

  private ended(keys: SessionKey[], reason: string): void {
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
    this.emit("ended", theirs, reason);
  }

  private finish(): void {
    this.done = true;
    this.clearTimer();
    const error = this.error ?? connectionLost("the gateway is closed");
    for (const waiter of this.waiters.splice(0)) waiter.reject(error);
    this.emit("closed", this.error);
  }
}

/** A gateway, started: it connects (and reconnects) in the background; `await gw.connectedOnce()` to wait. */
export function openGateway(options: GatewayOptions): Gateway {
  const gateway = new Gateway(options);
  void gateway.run();
  return gateway;
}
