// The Session's keepalive and the Link's backoff on a fake clock and a fake transport: which frames go out at
// which (virtual) time, no real sleeps, no sockets.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Session } from "../src/session.js";
import { BaseTransport } from "../src/transport/transport.js";
import { decodeBody } from "../src/protocol/frame.js";
import { connectionLost } from "../src/protocol/errors.js";
import type { Clock } from "../src/core/clock.js";
import type { Connector } from "../src/transport/transport.js";
import { decode } from "@msgpack/msgpack";

class FakeClock implements Clock {
  t = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();
  private next = 1;
  now(): number { return this.t; }
  setTimer(fn: () => void, seconds: number): unknown {
    const id = this.next++;
    this.timers.set(id, { at: this.t + Math.max(0, seconds), fn });
    return id;
  }
  clearTimer(handle: unknown): void { this.timers.delete(handle as number); }
  /** Run every timer due up to `t`, in time order. */
  async advance(to: number): Promise<void> {
    for (;;) {
      await new Promise((r) => setImmediate(r)); // let promise continuations run
      let first: [number, { at: number; fn: () => void }] | undefined;
      for (const entry of this.timers) if (entry[1].at <= to && (!first || entry[1].at < first[1].at)) first = entry;
      if (!first) break;
      this.timers.delete(first[0]);
      this.t = first[1].at;
      first[1].fn();
    }
    this.t = to;
    await new Promise((r) => setImmediate(r));
  }
}

class FakeTransport extends BaseTransport {
  readonly remote = "fake:1";
  sent: Array<{ at: number; op: string }> = [];
  constructor(private clock: FakeClock, private answer: (op: string) => object | null) { super(); }
  send(body: Uint8Array): boolean {
    if (this.ended) return false;
    const message = decode(body) as { op: string };
    this.sent.push({ at: this.clock.t, op: message.op });
    const reply = this.answer(message.op);
    if (reply) queueMicrotask(() => this.onMessage(decodeBody(new Uint8Array(encodeMap(reply)))));
    return true;
  }
  get bufferedAmount(): number { return 0; }
  close(): void { this.finish(connectionLost("closed")); }
}

import { encode } from "@msgpack/msgpack";
const encodeMap = (value: object): Uint8Array => encode(value);

/** A fake clock and a connector whose transports welcome with timeout 30 and answer every ping. */
function ponging(): { clock: FakeClock; transports: FakeTransport[]; connector: Connector } {
  const clock = new FakeClock();
  const transports: FakeTransport[] = [];
  const connector: Connector = async () => {
    const t = new FakeTransport(clock, (op) => op === "login" ? { op: "welcome", uid: "a", timeout: 30 } : op === "ping" ? { op: "pong" } : null);
    transports.push(t);
    return t;
  };
  return { clock, transports, connector };
}

test("askAfter 0: pings every min(k, T/1.5) of silence; a msg postpones the next one", async () => {
  const { clock, transports, connector } = ponging();
  const session = new Session({ host: "fake:1", uid: "a", keepalive: 20, connector, clock, askAfter: 0 }).start();
  await clock.advance(0);
  assert.ok(session.connected);
  await clock.advance(45);
  assert.deepEqual(transports[0]!.sent.map((s) => [s.at, s.op]), [[0, "login"], [20, "ping"], [40, "ping"]]);
  session.sendData("x"); // at 45
  await clock.advance(70);
  assert.deepEqual(transports[0]!.sent.slice(3).map((s) => [s.at, s.op]), [[45, "msg"], [65, "ping"]]);
  assert.equal(session.pongs, 3);
});

test("by default most keepalives are quiet: a ping only two timeouts after the last one", async () => {
  const { clock, transports, connector } = ponging();
  const session = new Session({ host: "fake:1", uid: "a", keepalive: 20, connector, clock }).start();
  await clock.advance(0);
  await clock.advance(45);
  assert.deepEqual(transports[0]!.sent.map((s) => [s.at, s.op]), [[0, "login"], [20, "msg"], [40, "msg"]]);
  session.sendData("x"); // at 45: activity, not a question
  await clock.advance(150); // (advance takes the clock to a time)
  // 65: the welcome is 60 s (2 T) old: a ping; then quiet until the ping is 60 s old
  assert.deepEqual(transports[0]!.sent.slice(3).map((s) => [s.at, s.op]),
    [[45, "msg"], [65, "ping"], [85, "msg"], [105, "msg"], [125, "ping"], [145, "msg"]]);
  assert.deepEqual([session.pings, session.quietKeepalives, session.pongs], [2, 5, 2]);
});

test("a ping unanswered for one timeout drops the connection; the backoff then counts from zero", async () => {
  const clock = new FakeClock();
  let answering = true;
  const transports: FakeTransport[] = [];
  const connector: Connector = async () => {
    const t = new FakeTransport(clock, (op) => op === "login" ? { op: "welcome", uid: "a", timeout: 3 } : op === "ping" && answering ? { op: "pong" } : null);
    transports.push(t);
    return t;
  };
  const delays: number[] = [];
  const session = new Session({ host: "fake:1", uid: "a", keepalive: 2, connector, clock, askAfter: 0, backoff: { base: 1, cap: 8, random: () => 0.5 } });
  session.on("disconnected", ({ retryIn }) => delays.push(retryIn));
  session.start();
  await clock.advance(0);
  answering = false;
  await clock.advance(2); // ping at 2, unanswered
  await clock.advance(4.9);
  assert.equal(session.connections, 1);
  await clock.advance(5); // 2 + one timeout (3 s): dropped
  assert.deepEqual(delays, [0.5]); // was up: attempt 0 -> uniform(0, base) with random 0.5
  answering = true;
  await clock.advance(5.5);
  assert.equal(session.connections, 2);
  assert.equal(transports.length, 2);
});

test("by default a dead path is noticed within askAfter + one interval + one timeout", async () => {
  const clock = new FakeClock();
  const connector: Connector = async () => new FakeTransport(clock, (op) => op === "login" ? { op: "welcome", uid: "a", timeout: 3 } : null);
  const session = new Session({ host: "fake:1", uid: "a", keepalive: 2, connector, clock, reconnect: false }).start();
  await clock.advance(0); // welcomed at 0; nothing answers from now on
  // quiet at 2 and 4, the ping at 6 (askAfter 2 T = 6 s), unanswered; quiet at 8 (the ping is outstanding)
  await clock.advance(8.9);
  assert.equal(session.connected, true);
  assert.deepEqual([session.quietKeepalives, session.pings], [3, 1]);
  await clock.advance(9.1); // 6 + one timeout (3 s): dropped
  assert.equal(session.connected, false);
  assert.equal(session.lastError?.code ?? session.error?.code, "connection_lost");
});

test("a refused first login backs off one step up, then doubles; final errors stop at once", async () => {
  const clock = new FakeClock();
  let reply: object = { op: "error", code: "busy", reason: "full" };
  const connector: Connector = async () => new FakeTransport(clock, (op) => op === "login" ? reply : null);
  const delays: number[] = [];
  const session = new Session({ host: "fake:1", uid: "a", connector, clock, backoff: { base: 1, cap: 8, random: () => 1 } });
  session.on("disconnected", ({ retryIn }) => delays.push(retryIn));
  session.start();
  await clock.advance(0);
  await clock.advance(2);
  await clock.advance(6);
  assert.deepEqual(delays, [2, 4, 8]);
  reply = { op: "error", code: "auth_failed", reason: "bad token" };
  await clock.advance(14);
  assert.equal(session.done, true);
  assert.equal(session.error?.code, "auth_failed");
  assert.deepEqual(delays, [2, 4, 8]);
});

test("not_leader with a hint goes to the named core at once; a round of refusals backs off", async () => {
  const clock = new FakeClock();
  const dialled: string[] = [];
  const leader = { current: "c:3" };
  const connector: Connector = async (address) => {
    dialled.push(address);
    return new FakeTransport(clock, (op) => op !== "login" ? null : address === leader.current
      ? { op: "welcome", uid: "a", timeout: 30 }
      : { op: "error", code: "not_leader", reason: "standby", leader: leader.current });
  };
  const session = new Session({ host: ["a:1", "b:2", "c:3"], uid: "a", connector, clock, backoff: { base: 1, random: () => 1 } }).start();
  await clock.advance(0);
  assert.deepEqual(dialled, ["a:1", "c:3"]); // a's hint, not the list's next (b)
  assert.equal(session.connections, 1);
  leader.current = "b:2";
  (session as unknown as { drop(e: Error): void }).drop(connectionLost("leader lost"));
  await clock.advance(1);
  // The last leader first (after the backoff), then at once where its refusal points.
  assert.deepEqual(dialled, ["a:1", "c:3", "c:3", "b:2"]);
  assert.equal(session.address, "b:2");
  const closing = session.close(0);
  await clock.advance(2);
  await closing;
  assert.equal(session.done, true);
  assert.equal(session.error, null);
});

test("a token function is asked before every login; a failed fetch is retried like a lost connection", async () => {
  const clock = new FakeClock();
  const tokens: string[] = [];
  const connector: Connector = async () => new FakeTransport(clock, (op) => op === "login" ? { op: "welcome", uid: "a", timeout: 30 } : null);
  let n = 0;
  const session = new Session({
    host: "fake:1", uid: "a", connector, clock, backoff: { base: 1, random: () => 1 },
    token: async () => {
      n += 1;
      if (n === 1) throw new Error("backend down");
      tokens.push(`t${n}`);
      return `t${n}`;
    },
  });
  const errors: string[] = [];
  session.on("disconnected", ({ error }) => errors.push(error.message));
  session.start();
  await clock.advance(0);
  assert.deepEqual(errors, ["connection_lost: no login: backend down"]);
  await clock.advance(1);
  assert.equal(session.connections, 1);
  (session as unknown as { drop(e: Error): void }).drop(connectionLost("lost"));
  await clock.advance(2);
  assert.equal(session.connections, 2);
  assert.deepEqual(tokens, ["t2", "t3"]);
});
