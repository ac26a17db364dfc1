// Sessions against a real `idled serve` (the scenarios of tests/client/scenarios.py that apply to a user).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Daemon, startDaemon, sleep, until } from "./support/daemon.js";
import { collect, closedOf } from "./support/peers.js";
import { Session, Observer } from "../src/index.js";
import type { IdledError } from "../src/index.js";

const FAST = { base: 0.05, cap: 0.5 };
let idled: Daemon;
before(async () => { idled = await startDaemon(); });
after(async () => { await idled.close(); });

test("session_keepalive_and_bye", async () => {
  const observer = new Observer({ host: idled.address, name: "watch-1", after: 0 }).start();
  const events = collect(observer, (e) => e.uid === "alice" && e.kind === "offline");
  const session = new Session({ host: idled.address, uid: "alice", keepalive: 1 });
  const online = new Promise((resolve) => session.once("online", resolve));
  session.start();
  assert.deepEqual(await online, { timeout: 1.5, connections: 1, address: idled.address });
  assert.equal(session.timeout, 1.5);
  assert.ok(session.sendData({ hello: [1, 2] }));
  await sleep(4000); // more than two timeouts: only the automatic keepalives keep alice online
  // Most are quiet; one asks for an answer once the welcome is two timeouts (3 s) old.
  assert.ok(session.quietKeepalives >= 2 && session.pings >= 1, `${session.quietKeepalives} quiet, ${session.pings} pings`);
  await until(() => session.pongs >= 1, "a pong");
  assert.deepEqual(await observer.query(["alice"]), new Map([["alice", true]]));
  await session.close();
  const got = (await events).filter((e) => e.uid === "alice").map((e) => [e.kind, e.reason]);
  assert.deepEqual(got, [["online", "login"], ["offline", "logout"]]);
  assert.equal(session.connections, 1);
  await observer.close();
});

test("second_login_kicks_the_first", async () => {
  const first = new Session({ host: idled.address, uid: "bob", keepalive: 5, backoff: FAST }).start();
  await first.waitConnected();
  const kicked = new Promise<IdledError>((resolve) => first.once("kicked", resolve));
  const second = new Session({ host: idled.address, uid: "bob", keepalive: 5 }).start();
  const error = await kicked;
  assert.equal(error.code, "kicked");
  assert.equal(error.retryable, false);
  assert.equal((await closedOf(first))?.message, error.message);
  await assert.rejects(first.wait(), (e: IdledError) => e.code === "kicked");
  assert.equal(first.connections, 1); // kicked is final: no reconnect that would kick the newer login
  assert.equal(first.sendData("late"), false);
  assert.ok(second.connected);
  await second.close();
});

test("devices_are_sessions_of_one_user", async () => {
  const observer = new Observer({ host: idled.address, name: "watch-2", uids: ["carol"] }).start();
  await observer.watch([]); // a round trip: the subscription is in place
  const events = collect(observer, (e) => e.kind === "offline");
  const phone = new Session({ host: idled.address, uid: "carol", keepalive: 1, device: "phone" }).start();
  assert.deepEqual(phone.key, ["carol", "phone"]);
  await phone.waitConnected();
  const laptop = new Session({ host: idled.address, uid: "carol", keepalive: 1, device: "laptop" }).start();
  await laptop.waitConnected();
  const laptop2 = new Session({ host: idled.address, uid: "carol", keepalive: 1, device: "laptop" }).start();
  await assert.rejects(laptop.wait(), (e: IdledError) => e.code === "kicked");
  await laptop2.close();
  await sleep(2000); // past the 1.5 s timeout: the automatic pings keep the phone's session alive
  assert.deepEqual(await observer.query(["carol"]), new Map([["carol", true]]));
  await phone.close();
  const got = (await events).map((e) => [e.uid, e.kind, e.reason, e.device]);
  assert.deepEqual(got, [["carol", "online", "login", "phone"], ["carol", "offline", "logout", "phone"]]);
  await observer.close();
});

test("a session whose pongs stop is dropped and logged in again (SIGSTOP, SIGCONT)", async () => {
  // The daemon is frozen: TCP stays up, nothing answers. After one timeout without a reply the session
  // drops the connection itself instead of waiting for TCP to notice.
  const session = new Session({ host: idled.address, uid: "dora", keepalive: 1, backoff: FAST }).start();
  await session.waitConnected();
  const lost = new Promise<IdledError>((resolve) => session.once("disconnected", ({ error }) => resolve(error)));
  idled.proc!.kill("SIGSTOP");
  try {
    const error = await lost;
    assert.equal(error.code, "connection_lost");
    assert.match(error.reason, /no reply to a ping/);
  } finally {
    idled.proc!.kill("SIGCONT");
  }
  await until(() => session.connections >= 2, "dora logged in again");
  await session.close();
});

test("sessions_come_back_after_a_restart", async () => {
  const observer = new Observer({ host: idled.address, name: "watch-3", uids: ["erin"], backoff: FAST }).start();
  await observer.watch([]);
  const session = new Session({ host: idled.address, uid: "erin", keepalive: 1, backoff: FAST }).start();
  const seen = collect(observer, (_, all) => all.length >= 3);
  await session.waitConnected();
  await idled.restart();
  await until(() => session.connections === 2 && observer.connections === 2, "both reconnected");
  assert.ok(["server_shutdown", "connection_lost"].includes(session.lastError!.code), session.lastError!.code);
  const events = (await seen).map((e) => [e.kind, e.reason]);
  assert.deepEqual(events, [["online", "login"], ["offline", "shutdown"], ["online", "login"]]);
  assert.deepEqual(await observer.query(["erin"]), new Map([["erin", true]]));
  await session.close();
  await observer.close();
});

test("close() before start() ends the session at once, with closed", async () => {
  const session = new Session({ host: idled.address, uid: "zed" });
  const closed = new Promise((resolve) => session.once("closed", resolve));
  await session.close();
  assert.deepEqual(await closed, { error: null });
  assert.equal(session.done, true);
  assert.equal(session.connections, 0);
  await assert.rejects(session.waitConnected(), (e: Error) => /closed/.test(e.message));
});
