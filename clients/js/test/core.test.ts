// The pure rules with plain numbers: the keepalive schedule, full-jitter backoff, the leader search (the
// worked examples of idled/client/leader.py), the observer cursor, and the Session's timer on a fake clock.
import { test } from "node:test";
import assert from "node:assert/strict";
import { asksForAnswer, defaultAskAfter, pingInterval, KeepaliveTimer, Backoff } from "../src/core/keepalive.js";
import { LeaderSearch } from "../src/core/leader.js";
import { ObserverCursor, uidChunks } from "../src/core/cursor.js";
import { parseAddresses, splitHostPort } from "../src/core/address.js";
import { encodeBody } from "../src/protocol/frame.js";
import type { PresenceEvent } from "../src/protocol/messages.js";

test("a keepalive asks for an answer only askAfter after the last ping (default: one in three)", () => {
  assert.equal(defaultAskAfter(30), 60);
  assert.equal(defaultAskAfter(0.2), 1);
  assert.equal(asksForAnswer(20, 0, null, 60), false); // asked (welcomed) 20 s ago: quiet
  assert.equal(asksForAnswer(60, 0, null, 60), true);
  assert.equal(asksForAnswer(80, 0, 60, 60), false); // a ping is outstanding: it is the question already
  assert.equal(asksForAnswer(20, 19.9, null, 0), true); // askAfter 0: every keepalive is a ping
  let asked = 0;
  const pings: boolean[] = [];
  for (let n = 1; n < 10; n++) {
    const now = n * 20; // the default keepalive: T / 1.5
    pings.push(asksForAnswer(now, asked, null, defaultAskAfter(30)));
    if (pings.at(-1)) asked = now;
  }
  assert.deepEqual(pings, [false, false, true, false, false, true, false, false, true]);
});

test("ping interval: min(k, T / 1.5), T / 1.5 without a keepalive, none without a timeout", () => {
  assert.equal(pingInterval(30, 20), 20); // T = 1.5 k: ping every k
  assert.equal(pingInterval(60, 3600), 40); // the server capped T: ping a third of T before the deadline
  assert.equal(pingInterval(30, undefined), 20);
  assert.equal(pingInterval(1.5, 1), 1);
  assert.equal(pingInterval(2, 1), 1); // a timeout raised to the server's tick: still every k
  assert.equal(pingInterval(undefined, 20), null);
  const timer = new KeepaliveTimer(20, 100);
  assert.equal(timer.deadline, 120);
  assert.equal(timer.due(119.9), false);
  assert.equal(timer.due(120), true);
  timer.sent(110); // a msg is activity: it postpones the ping
  assert.equal(timer.deadline, 130);
  assert.equal(new KeepaliveTimer(null, 0).due(1e9), false);
});

test("full-jitter backoff: uniform(0, min(cap, base * 2^n))", () => {
  const top = new Backoff({ base: 0.1, cap: 30, random: () => 0.999999 });
  assert.deepEqual([0, 1, 2, 3].map((n) => Number(top.delay(n).toFixed(3))), [0.1, 0.2, 0.4, 0.8]);
  assert.ok(Math.abs(top.delay(20) - 30) < 1e-3); // capped
  assert.ok(Math.abs(top.delay(10_000) - 30) < 1e-3); // no overflow
  const half = new Backoff({ base: 1, cap: 8, random: () => 0.5 });
  assert.deepEqual([0, 1, 2, 3, 4].map((n) => half.delay(n)), [0.5, 1, 2, 4, 4]);
  assert.equal(new Backoff({ random: () => 0 }).delay(5), 0);
  assert.throws(() => new Backoff({ base: 0 }), RangeError);
});

const at = (search: LeaderSearch): string => search.target;

test("leader search: the members in turn, then a backoff", () => {
  const search = new LeaderSearch(["A", "B", "C"]);
  assert.equal(search.target, "A");
  assert.ok(search.failed() && at(search) === "B");
  assert.ok(search.failed() && at(search) === "C");
  assert.ok(!search.failed() && at(search) === "A");
  const one = new LeaderSearch(["A"]);
  assert.ok(!one.failed() && at(one) === "A"); // one core: every failure ends a round
});

test("leader search: the worked example, hints first, no ping-pong", () => {
  const search = new LeaderSearch(["S", "A"]);
  assert.ok(search.failed("A") && at(search) === "A");
  search.connected();
  assert.equal(search.leader, "A");
  search.lost();
  assert.equal(search.target, "A");
  assert.ok(search.failed() && at(search) === "S");
  assert.ok(!search.failed("A") && at(search) === "A");
  assert.ok(search.failed() && at(search) === "S");
  search.connected();
  assert.equal(search.leader, "S");
  const stale = new LeaderSearch(["A", "B"]);
  assert.ok(stale.failed("B") && at(stale) === "B");
  assert.ok(!stale.failed("A"));
});

test("leader search: hints outside the list at most len(members) times per round", () => {
  const search = new LeaderSearch(["A", "B"]);
  assert.ok(search.failed("X") && at(search) === "X");
  assert.ok(search.failed("Y") && at(search) === "Y");
  assert.ok(search.failed("Z") && at(search) === "B");
  assert.ok(!search.failed("W") && at(search) === "W");
  const lost = new LeaderSearch(["A", "B"]);
  lost.connected();
  lost.lost("B");
  assert.equal(lost.target, "B");
});

test("leader search: every round ends and tries every member (random walks)", () => {
  let seed = 7;
  const rand = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  for (let run = 0; run < 300; run++) {
    const pool = ["A", "B", "C", "D", "X", "Y"];
    const members = [...new Set(Array.from({ length: 1 + rand(4) }, () => pool[rand(pool.length)]!))];
    const search = new LeaderSearch(members);
    let tried = new Set([search.target]);
    let attempts = 1;
    for (let i = 0; i < 60; i++) {
      const hint = rand(3) === 0 ? null : "ABCDXYZ"[rand(7)]!;
      if (!search.failed(hint)) {
        for (const m of members) assert.ok(tried.has(m), `round ended before ${m} was tried`);
        assert.ok(attempts <= 2 * members.length + 1);
        tried = new Set();
        attempts = 0;
      }
      tried.add(search.target);
      attempts += 1;
    }
  }
});

test("addresses: host:port, [v6]:port, bare hosts take the default port, lists", () => {
  assert.deepEqual(splitHostPort("a:7000", 7878), { host: "a", port: 7000 });
  assert.deepEqual(splitHostPort("[::1]:7000", 7878), { host: "::1", port: 7000 });
  assert.deepEqual(splitHostPort("::1", 7878), { host: "::1", port: 7878 });
  assert.deepEqual(parseAddresses("a, b:1,a:7878", 7878), ["a:7878", "b:1"]);
  assert.deepEqual(parseAddresses(["[::1]", "c:2"], 7878), ["[::1]:7878", "c:2"]);
  assert.throws(() => splitHostPort("a:0", 7878), RangeError);
  assert.throws(() => splitHostPort("a:x", 7878), RangeError);
  assert.throws(() => splitHostPort(":1", 7878), RangeError);
});

const event = (seq: number): PresenceEvent =>
  ({ op: "event", seq, kind: "online", uid: "u", ts: 0, reason: "login", last_seen: 0, deadline: 0 });

test("observer cursor: from last + 1, duplicates dropped, durable when given a checkpoint", () => {
  const now = new ObserverCursor();
  assert.deepEqual(now.subscribe(), { op: "subscribe" });
  assert.ok(now.accept(event(5)));
  assert.deepEqual(now.subscribe(), { op: "subscribe", from: 6 });
  const checkpoint = new ObserverCursor(10);
  assert.deepEqual(checkpoint.subscribe(), { op: "subscribe", from: 11, durable: true });
  assert.equal(checkpoint.accept(event(10)), false);
  assert.equal(checkpoint.accept(event(11)), true);
  assert.equal(new ObserverCursor(0, false).durable, false);
  assert.throws(() => new ObserverCursor(-1), RangeError);
});

test("observer cursor: a long watchlist goes as watch messages before the subscribe, each within a frame", () => {
  const uids = Array.from({ length: 1500 }, (_, i) => `w${String(i).padStart(4, "0")}`);
  const cursor = new ObserverCursor(null, null, uids);
  cursor.accept(event(3));
  const messages = cursor.subscribeMessages(4096);
  assert.ok(messages.length >= 3);
  assert.ok(messages.slice(0, -1).every((m) => m.op === "watch"));
  const last = messages.at(-1)!;
  assert.equal(last.op, "subscribe");
  assert.equal((last as { from?: number }).from, 4);
  assert.deepEqual(messages.flatMap((m) => [...(m as unknown as { uids: string[] }).uids]), uids);
  for (const m of messages) assert.ok(encodeBody(m).length <= 4096);
  assert.deepEqual(new ObserverCursor(null, null, []).subscribeMessages(), [{ op: "subscribe", uids: [] }]);
  assert.deepEqual(cursor.watch(["x", "x"]), [{ op: "watch", uids: ["x"] }]);
  assert.deepEqual(cursor.unwatch(["w0000"]), [{ op: "unwatch", uids: ["w0000"] }]);
  assert.equal([...cursor.uids!].at(-1), "x");
  assert.throws(() => new ObserverCursor().watch(["a"]), TypeError);
  assert.ok(uidChunks([1, 2, 3]).length === 1);
});
