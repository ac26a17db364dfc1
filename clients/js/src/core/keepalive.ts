/**
 * When to ping, and how long to back off: the pure rules of idled/client/core.py, with times as arguments and
 * randomness injected, so unit tests use plain numbers.
 *
 * Keepalive: a user asking for keepalive k gets a timeout T = min(1.5 k, max_timeout) in `welcome` (at least a
 * tick). The client pings when it has sent nothing for `pingInterval(T, k)` = min(k, T / 1.5) seconds, so the
 * ping is due a third of the timeout before the deadline even when the server capped T. Any frame sent counts
 * as activity and postpones the ping. Most keepalives ask for no answer: one is a `ping` (answered with a
 * `pong`) only when the last ping (or the welcome) is `askAfter` seconds old (default two timeouts) and has
 * been answered; the others are the quiet `{op: "msg"}`, activity the server does not answer (a pong costs
 * the server a send, a fifth of a keepalive's CPU at 4,700 a second, and one per `askAfter` proves the path
 * alive as well).
 *
 * Backoff: attempt n (0-based) waits uniform(0, min(cap, base * 2^n)) seconds -- "full jitter", so that 100k
 * clients cut off by one restart spread their return over the whole window instead of arriving in lockstep.
 */

/** The factor between keepalive and timeout (MQTT's rule, idled/core/timeouts.py KEEPALIVE_FACTOR). */
export const KEEPALIVE_FACTOR = 1.5;

/** Seconds of silence after which to ping, or null when the connection needs no keepalive. */
export function pingInterval(timeout: number | undefined | null, keepalive: number | undefined | null): number | null {
  if (timeout === undefined || timeout === null) return null;
  const interval = timeout / KEEPALIVE_FACTOR;
  return keepalive === undefined || keepalive === null ? interval : Math.min(keepalive, interval);
}

/** Seconds after the last ping (or the welcome) at which a keepalive asks for an answer again: two timeouts,
 * at least a second (at the default keepalive, one keepalive in three is a ping). */
export function defaultAskAfter(timeout: number): number {
  return Math.max(2 * timeout, 1);
}

/** Whether the keepalive due at `now` is a ping (answered) rather than the quiet `{op: "msg"}`: no ping is
 * outstanding (`pingSent`), and the last one -- or the welcome -- (`asked`) is `askAfter` seconds old or older
 * (0: always). */
export function asksForAnswer(now: number, asked: number, pingSent: number | null, askAfter: number): boolean {
  return pingSent === null && now - asked >= askAfter;
}

/** When a ping is due: `sent(now)` after every frame; `deadline` is the next ping's time (null: never). */
export class KeepaliveTimer {
  constructor(readonly interval: number | null, public lastSent: number) {}

  sent(now: number): void {
    this.lastSent = now;
  }

  get deadline(): number | null {
    return this.interval === null ? null : this.lastSent + this.interval;
  }

  due(now: number): boolean {
    const deadline = this.deadline;
    return deadline !== null && now >= deadline;
  }
}

export interface BackoffOptions {
  /** Seconds of the first window. Default 0.1. */
  base?: number;
  /** The largest window, seconds. Default 30. */
  cap?: number;
  /** A uniform random number in [0, 1). Default Math.random. */
  random?: () => number;
}

/** Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2^n)). */
export class Backoff {
  readonly base: number;
  readonly cap: number;
  readonly random: () => number;

  constructor(options: BackoffOptions = {}) {
    this.base = options.base ?? 0.1;
    this.cap = options.cap ?? 30;
    this.random = options.random ?? Math.random;
    if (!(this.base > 0 && this.cap >= this.base)) throw new RangeError("backoff: need 0 < base <= cap");
  }

  delay(attempt: number): number {
    return this.random() * Math.min(this.cap, this.base * 2 ** Math.min(attempt, 62));
  }
}
