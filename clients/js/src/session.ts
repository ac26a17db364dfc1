/**
 * A user's session: login with token and device, automatic keepalive pings, `send(data)`, `bye` on close,
 * reconnects (with leader following) -- the same on a browser's WebSocket and Node's TCP/TLS.
 *
 * Theory of operation
 * -------------------
 * After `welcome` the session knows its timeout T and sends a keepalive whenever it has sent nothing for
 * `pingInterval(T, keepalive)` = min(k, T / 1.5) seconds (core/keepalive.ts): one timer sleeps until
 * `lastSent + interval`, re-checks (a `send` in between moved `lastSent`), and sends one. A keepalive is the
 * quiet `{op: "msg"}`, which the server does not answer, unless the last ping (or the welcome) is `askAfter`
 * seconds old (default 2 T, one keepalive in three; 0: every keepalive): then it is a `ping`, answered with a
 * `pong`. A ping
 * that gets no reply (nor any other frame) within one timeout (at least 1 s) means the path is dead even if
 * TCP has not noticed: the connection is dropped and logged in again after a backoff. A silent path is thus
 * noticed within `askAfter` + one keepalive + T at the most. A reconnect within the timeout is a login the
 * server takes as the same session (newest wins): no offline, no online, no event at all.
 *
 * Events: `online` at every welcome (the first login and each reconnect), `disconnected` when a connection
 * ends or an attempt fails (with the error and the seconds until the next attempt), `kicked` when a newer
 * login of the same session replaced this one (final: reconnecting would kick the newer one in turn), and
 * `closed` once, when the session stops for good (`error`: the final error, null after `close()`).
 */

import { Link } from "./link.js";
import type { LinkEvents, LinkOptions } from "./link.js";
import { asksForAnswer, defaultAskAfter, KeepaliveTimer, pingInterval } from "./core/keepalive.js";
import { connectionLost, ErrorCode } from "./protocol/errors.js";
import type { IdledError } from "./protocol/errors.js";
import { checkDevice, checkKeepalive, checkUid } from "./protocol/messages.js";
import type { ClientMessage, SessionKey, ServerMessage, Uid, UserLogin, Welcome } from "./protocol/messages.js";
import type { Connector, Transport } from "./transport/transport.js";

export interface SessionOptions extends LinkOptions {
  uid: Uid;
  /** The uid's token (auth on); a function is called before every login, and may return a promise (a page
   * fetches a fresh token from its backend for each login, so an expired one is never sent again). */
  token?: string | (() => string | Promise<string>);
  /** Seconds between keepalives the session asks for (1..86400); the server answers with its timeout. */
  keepalive?: number;
  /** This session is one device of the user (key [uid, device]); other devices' sessions coexist. */
  device?: string;
  /** Seconds without a frame from the server after which a keepalive asks for an answer (a `ping`); the
   * others are quiet. Default two timeouts; 0: every keepalive is a ping. */
  askAfter?: number;
}

export interface SessionEvents extends LinkEvents {
  online: { timeout: number | null; connections: number; address: string };
  kicked: IdledError;
}

export class Session extends Link<SessionEvents> {
  readonly uid: Uid;
  readonly keepalive: number | undefined;
  readonly device: string | undefined;
  readonly askAfter: number | undefined;
  /** Keepalives that asked for an answer (and pings sent by `ping()`). */
  pings = 0;
  /** Keepalives that did not. */
  quietKeepalives = 0;
  pongs = 0;
  private readonly token: SessionOptions["token"];
  private timer = new KeepaliveTimer(null, 0);
  private pingSent: number | null = null; // when the unanswered ping went out
  private asked = 0; // when the last ping went out (the welcome arrived, at first)
  private wakeHandle: unknown = null;

  constructor(options: SessionOptions, defaultConnector?: Connector) {
    super(options, defaultConnector);
    this.uid = checkUid(options.uid);
    this.keepalive = options.keepalive === undefined ? undefined : checkKeepalive(options.keepalive);
    this.device = options.device === undefined ? undefined : checkDevice(options.device);
    this.token = options.token;
    if (options.askAfter !== undefined && !(options.askAfter >= 0)) {
      throw new RangeError(`askAfter must be >= 0 seconds, got ${String(options.askAfter)}`);
    }
    this.askAfter = options.askAfter;
    this.on("connected", ({ welcome, connections, address }) => {
      this.emit("online", { timeout: welcome.timeout ?? null, connections, address });
    });
    this.on("closed", ({ error }) => {
      if (error?.code === ErrorCode.KICKED) this.emit("kicked", error);
    });
  }

  /** The key the server knows this session by: the uid, or [uid, device]. */
  get key(): SessionKey {
    return this.device === undefined ? this.uid : [this.uid, this.device];
  }

  /** Seconds of silence after which the server marks this user offline (from the last `welcome`). */
  get timeout(): number | null {
    return this.welcome?.timeout ?? null;
  }

  protected async login(): Promise<UserLogin> {
    const login: UserLogin = { op: "login", uid: this.uid };
    const token = typeof this.token === "function" ? await this.token() : this.token;
    if (token !== undefined) login.token = token;
    if (this.keepalive !== undefined) login.keepalive = this.keepalive;
    if (this.device !== undefined) login.device = this.device;
    return login;
  }

  /** An application `msg` (also activity: it postpones the next ping); false while reconnecting. */
  sendData(data?: unknown): boolean {
    return this.send(data === undefined ? { op: "msg" } : { op: "msg", data });
  }

  /** A keepalive now (the session pings by itself; this is for applications that want one more). */
  ping(): boolean {
    return this.send({ op: "ping" });
  }

  protected override onSent(message: ClientMessage): void {
    const now = this.clock.now();
    this.timer.sent(now);
    if (message.op === "ping") {
      this.pings += 1;
      this.asked = now;
      this.pingSent ??= now;
    }
  }

  protected override onWelcome(_transport: Transport, welcome: Welcome): void {
    this.timer = new KeepaliveTimer(pingInterval(welcome.timeout, this.keepalive), this.clock.now());
    this.pingSent = null;
    this.asked = this.clock.now();
    this.schedule();
  }

  protected override onMessage(message: ServerMessage): void {
    this.pingSent = null; // any frame proves the path is alive; users get only pongs today
    if (message.op === "pong") this.pongs += 1;
  }

  protected override onDisconnect(): void {
    this.clock.clearTimer(this.wakeHandle);
    this.wakeHandle = null;
  }

  /** The keepalive timer (see the module comment): wake at the ping's deadline or the pong's patience. */
  private schedule(): void {
    this.clock.clearTimer(this.wakeHandle);
    const deadline = this.timer.deadline;
    if (deadline === null) return;
    // How long a ping may go unanswered: one whole timeout (by then the server would have expired a silent
    // user anyway), at least a second, so a loaded machine's slow pong is not a dead connection.
    const patience = Math.max(this.timeout ?? 0, 1);
    const now = this.clock.now();
    const wake = this.pingSent === null ? deadline : Math.min(deadline, this.pingSent + patience);
    this.wakeHandle = this.clock.setTimer(() => this.tick(patience), wake - now);
  }

  private tick(patience: number): void {
    this.wakeHandle = null;
    const now = this.clock.now();
    if (this.pingSent !== null && now - this.pingSent >= patience) {
      this.drop(connectionLost(`no reply to a ping within ${patience} s`));
      return;
    }
    if (this.timer.due(now)) {
      const askAfter = this.askAfter ?? defaultAskAfter(patience);
      if (asksForAnswer(now, this.asked, this.pingSent, askAfter)) {
        this.send({ op: "ping" });
      } else if (this.send({ op: "msg" })) {
        this.quietKeepalives += 1;
      }
    }
    if (this.connected) this.schedule();
  }
}
