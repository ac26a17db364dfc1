/**
 * The one place the client reads time and sets timers, injectable so tests can drive the rules by hand.
 * Seconds throughout, like the protocol (keepalive, timeout): `now()` is monotonic (performance.now), never
 * the wall clock, so a clock step does not fire or delay a ping.
 */

export interface Clock {
  /** Monotonic seconds. */
  now(): number;
  /** Call `fn` after `seconds`; the handle cancels it. */
  setTimer(fn: () => void, seconds: number): unknown;
  clearTimer(handle: unknown): void;
}

export const realClock: Clock = {
  now: () => performance.now() / 1000,
  setTimer: (fn, seconds) => setTimeout(fn, Math.max(0, seconds * 1000)),
  clearTimer: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};
