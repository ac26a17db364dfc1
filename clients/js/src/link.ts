/**
 * The connection loop shared by every role (session, observer, and the Node gateway built on it).
 *
 * Theory of operation
 * -------------------
 * A `Link` owns one logical connection to idled: `start()` runs a loop that connects, logs in, lets the role
 * restore its state on the new connection (`onWelcome`: an observer's subscription, a gateway's re-attach),
 * then hands every message to the role (`onMessage`) until the connection ends. The ending is an `IdledError`:
 * the server's `error` frame, the transport's `connection_lost`, or what the role gave `drop()` (a ping left
 * unanswered). A retryable one with `reconnect` on is followed by a full-jitter backoff sleep and a new
 * attempt; a final one (`auth_failed`, `kicked`, ...) or `close()` ends the loop, `error` keeps the final error
 * and `closed` is emitted once. The rules are idled/client/link.py's:
 *
 * - Several cores (`host: ["a:7878", "b:7878"]` or "a:7878,b:7878"): `LeaderSearch` picks each attempt's
 *   address. A failed login that another core could take moves at once to the core a `not_leader` named, else
 *   to the next one; the backoff is slept only between full rounds.
 * - The backoff counts failed attempts since the last connection that was set up (`settle`: the welcome, or an
 *   observer's subscription taken): a link that was up starts again from the shortest delay; a first login
 *   refused at once (`busy`) starts one step up, so a refusing server is not hammered.
 * - A connection that gives no `welcome` within `connectTimeout` is dropped (`connection_lost`).
 *
 * JavaScript runs one callback at a time, so there is no send lock: `onWelcome` runs before anyone else can
 * send on the new connection, and sends are queued by the transport in call order.
 */

import { Emitter } from "./core/emitter.js";
import { Backoff } from "./core/keepalive.js";
import type { BackoffOptions } from "./core/keepalive.js";
import { LeaderSearch } from "./core/leader.js";
import { parseAddresses, splitHostPort, formatAddress } from "./core/address.js";
import { realClock } from "./core/clock.js";
import type { Clock } from "./core/clock.js";
import { CONNECTION_LOST, IdledError, connectionLost, errorFrom } from "./protocol/errors.js";
import { encodeBody } from "./protocol/frame.js";
import { DEFAULT_PORT } from "./protocol/messages.js";
import type { ClientMessage, Login, ServerMessage, Welcome } from "./protocol/messages.js";
import type { Connector, Transport } from "./transport/transport.js";

export interface LinkOptions {
  /** One core ("host:port"; a bare host takes `port`), several as an array or comma-separated. */
  host: string | readonly string[];
  /** The port of a host given without one. Default 7878. */
  port?: number;
  /** How to open a connection (each entry point gives its platform's default). */
  connector?: Connector;
  /** Reconnect after a retryable failure (default true). */
  reconnect?: boolean;
  /** Backoff between rounds of attempts: a `Backoff`, or its options (base 0.1 s, cap 30 s). */
  backoff?: Backoff | BackoffOptions;
  /** Seconds for a connection to be welcomed (connect and login). Default 10. */
  connectTimeout?: number;
  /** Time and timers (tests inject their own). */
  clock?: Clock;
}

export interface LinkEvents {
  /** Logged in: the `welcome`, and how many logins this link has had (1 = the first). */
  connected: { welcome: Welcome; connections: number; address: string };
  /** A connection ended or an attempt failed; `retryIn`: seconds until the next attempt. */
  disconnected: { error: IdledError; retryIn: number };
  /** The link stopped for good: `error` is the final error, null after `close()`. */
  closed: { error: IdledError | null };
  [name: string]: unknown;
}

export abstract class Link<E extends LinkEvents = LinkEvents> extends Emitter<E> {
  readonly cores: LeaderSearch;
  readonly backoff: Backoff;
  readonly clock: Clock;
  readonly reconnect: boolean;
  readonly connectTimeout: number;
  welcome: Welcome | null = null;
  /** The final error, once the link stopped because of one. */
  error: IdledError | null = null;
  /** The latest retryable error. */
  lastError: IdledError | null = null;
  /** Successful logins: 1 + reconnects. */
  connections = 0;
  /** Connections whose setup the server accepted (see `settle`). */
  settled = 0;
  done = false;
  protected transport: Transport | null = null;
  protected closing = false;
  private readonly connector: Connector;
  private running: Promise<void> | null = null;
  private endConnection: ((error: IdledError) => void) | null = null;
  private ended: Promise<IdledError> | null = null; // the current connection's end
  private wake: (() => void) | null = null;
  private waiters: Array<{ resolve: () => void; reject: (error: IdledError) => void }> = [];

  constructor(options: LinkOptions, defaultConnector?: Connector) {
    super();
    const port = options.port ?? DEFAULT_PORT;
    this.cores = new LeaderSearch(parseAddresses(options.host, port));
    const backoff = options.backoff;
    this.backoff = backoff instanceof Backoff ? backoff : new Backoff(backoff);
    this.clock = options.clock ?? realClock;
    this.reconnect = options.reconnect ?? true;
    this.connectTimeout = options.connectTimeout ?? 10;
    const connector = options.connector ?? defaultConnector;
    if (connector === undefined) throw new TypeError("no connector: give options.connector");
    this.connector = connector;
  }

  /** The role's login message of a new connection (a promise when its token is fetched for each login). */
  protected abstract login(): Login | Promise<Login>;

  /** Whether a transport is up and logged in. */
  get connected(): boolean {
    return this.transport !== null;
  }

  /** The core being tried or connected to ("host:port"). */
  get address(): string {
    return this.cores.target;
  }

  /** Start the loop (once); returns this. */
  start(): this {
    this.running ??= this.run();
    return this;
  }

  /** Resolves when logged in (at once if connected); rejects with the final error if the link stopped. */
  waitConnected(): Promise<void> {
    if (this.transport !== null) return Promise.resolve();
    if (this.done) return Promise.reject(this.error ?? connectionLost("the client is closed"));
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Resolves once the link has stopped; rejects with its final error, if any. */
  async wait(): Promise<void> {
    await this.start().running;
    if (this.error !== null) throw this.error;
  }

  /** Send one message on the current connection; false when there is none (reconnecting or closed). */
  send(message: ClientMessage): boolean {
    const transport = this.transport;
    if (transport === null || !transport.send(encodeBody(message))) return false;
    this.onSent(message);
    return true;
  }

  /** Log out (`bye`) and stop reconnecting; waits up to `linger` seconds for the server to close first, so the
   * bye is not lost to a reset. */
  async close(linger = 1): Promise<void> {
    if (!this.closing && !this.done) {
      this.closing = true;
      this.wake?.();
      const transport = this.transport;
      if (transport !== null && transport.send(encodeBody({ op: "bye" }))) {
        await Promise.race([this.ended, this.sleep(linger)]);
      }
      this.endConnection?.(connectionLost("closed by the client"));
    }
    await this.start().running; // never started: the loop ends at once, `closed` is emitted all the same
  }

  /** End the current connection with `error` (the role found it dead); the loop decides what follows. */
  protected drop(error: IdledError): void {
    this.endConnection?.(error);
  }

  private sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = this.clock.setTimer(() => resolve(), seconds);
      this.wake = () => {
        this.clock.clearTimer(timer);
        resolve();
      };
    });
  }

  private async run(): Promise<void> {
    let attempt = 0;
    const cores = this.cores;
    try {
      while (!this.closing) {
        const before = this.settled;
        const error = await this.connection(cores.target);
        if (this.closing) return;
        const wasUp = this.settled > before;
        const hint = this.hint(error);
        if (wasUp) {
          cores.lost(hint);
        } else if (this.elsewhere(error) && cores.failed(hint)) {
          this.lastError = error; // another core is left in this round: at once, no backoff
          this.emitLink("disconnected", { error, retryIn: 0 });
          continue;
        }
        if (!this.retryable(error)) {
          this.error = error;
          return;
        }
        this.lastError = error;
        if (wasUp) attempt = 0;
        else if (this.connections === 0 && attempt === 0 && error.code !== CONNECTION_LOST) attempt = 1;
        const delay = this.backoff.delay(attempt);
        this.emitLink("disconnected", { error, retryIn: delay });
        await this.sleep(delay);
        attempt += 1;
      }
    } finally {
      this.done = true;
      this.onDone();
      for (const waiter of this.waiters.splice(0)) waiter.reject(this.error ?? connectionLost("the client is closed"));
      this.emitLink("closed", { error: this.error });
    }
  }

  /** The core a `not_leader` named, in the members' normal form (null: none, or unreadable). */
  private hint(error: IdledError): string | null {
    if (error.leader === undefined) return null;
    try {
      return formatAddress(splitHostPort(error.leader, DEFAULT_PORT));
    } catch {
      return null;
    }
  }

  /** Whether a failed login is worth trying at the next core of the round (even without reconnects). */
  private elsewhere(error: IdledError): boolean {
    return error.retryable || this.retryable(error);
  }

  /** Whether to reconnect after `error` (else it is the link's final error). */
  protected retryable(error: IdledError): boolean {
    return this.reconnect && error.retryable;
  }

  private async connection(address: string): Promise<IdledError> {
    let login: Login;
    try {
      login = await this.login();
    } catch (error) {
      // A token that could not be fetched (the application's backend is down): retried like a lost connection.
      return connectionLost(`no login: ${error instanceof Error ? error.message : String(error)}`);
    }
    let transport: Transport;
    try {
      transport = await this.connector(address);
    } catch (error) {
      return error instanceof IdledError ? error : connectionLost(String(error));
    }
    if (this.closing) {
      transport.close();
      return connectionLost("closed by the client");
    }
    return this.ended = new Promise<IdledError>((resolve) => {
      let up = false;
      let ended = false;
      const timer = this.clock.setTimer(
        () => end(connectionLost(`no welcome from ${address} within ${this.connectTimeout} s`)), this.connectTimeout);
      const end = (error: IdledError): void => {
        if (ended) return;
        ended = true;
        this.clock.clearTimer(timer);
        this.endConnection = null;
        transport.close();
        if (up) {
          this.transport = null;
          this.onDisconnect(error);
        }
        resolve(error);
      };
      this.endConnection = end;
      transport.onClose = end;
      transport.onMessage = (message: ServerMessage) => {
        if (ended) return;
        if (message.op === "error") return end(errorFrom(message.code, message.reason, message.leader));
        if (up) return this.onMessage(message);
        if (message.op !== "welcome") return end(new IdledError("bad_message", `expected welcome, got ${message.op}`));
        this.clock.clearTimer(timer);
        up = true;
        this.welcome = message;
        this.connections += 1;
        this.cores.connected();
        this.onWelcome(transport, message);
        if (ended) return;
        this.transport = transport;
        if (this.settlesAtWelcome()) this.settle();
        for (const waiter of this.waiters.splice(0)) waiter.resolve();
        this.emitLink("connected", { welcome: message, connections: this.connections, address });
      };
      transport.send(encodeBody(login));
    });
  }

  /** The server accepted this connection's setup: the welcome, or what the role sent after it. Only a
   * settled connection counts as up (see the module comment). */
  protected settle(): void {
    this.settled += 1;
  }

  protected emitLink<K extends keyof LinkEvents>(name: K, payload: LinkEvents[K]): void {
    (this.emit as (name: string, payload: unknown) => void)(name as string, payload);
  }

  // -- role hooks ---------------------------------------------------------------------------------------------

  /** Restore the role's state on a new connection (before anyone else may send on it). */
  protected onWelcome(_transport: Transport, _welcome: Welcome): void {}

  /** Whether the welcome ends this role's setup (an observer's subscription is answered later). */
  protected settlesAtWelcome(): boolean {
    return true;
  }

  /** A message other than `welcome` and `error`. */
  protected onMessage(_message: ServerMessage): void {}

  /** A message went out (a session counts it as activity). */
  protected onSent(_message: ClientMessage): void {}

  /** The connection ended (the link may reconnect). */
  protected onDisconnect(_error: IdledError): void {}

  /** The loop stopped for good. */
  protected onDone(): void {}
}
