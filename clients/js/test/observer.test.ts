// Observers against a real `idled serve`: resume without gap across restarts, watchlists, gone, query with
// last_seen (the scenarios of tests/client/scenarios.py that apply to an observer).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Daemon, startDaemon, until } from "./support/daemon.js";
import { RawGateway, record, contiguous, range } from "./support/peers.js";
import { Observer, Session } from "../src/index.js";
import type { Uid } from "../src/index.js";

const FAST = { base: 0.05, cap: 0.5 };
let idled: Daemon;
before(async () => { idled = await startDaemon(); });
after(async () => { await idled.close(); });

test("observer_resumes_across_restarts", async () => {
  const first = (await idled.lastSeq()) + 1;
  const gateway = await RawGateway.login(idled.address, "edge");
  const observer = new Observer({ host: idled.address, name: "resume", after: first - 1, backoff: FAST });
  const processed = record(observer);
  observer.start();
  gateway.attach(range(200), 30);
  await until(() => processed.length >= 50, "50 events");
  await idled.restart(); // events unread, partly in socket buffers: resumed from the last seq
  const again = await RawGateway.login(idled.address, "edge");
  again.attach(range(200), 30); // the gateway of a real edge re-attaches its sessions
  await until(() => processed.length >= 600, "600 events"); // 200 online, 200 shutdown, 200 online
  await observer.close();
  const checkpoint = processed.at(-1)!.seq;
  // The observer is gone (crash, redeploy) while 100 detaches happen; it restarts from its checkpoint.
  again.detach(range(100));
  await again.sync();
  const resumed = new Observer({ host: idled.address, name: "resume", after: checkpoint });
  record(resumed, processed);
  resumed.start();
  assert.equal(resumed.durable, true);
  await until(() => processed.length >= 700, "700 events");
  assert.equal(resumed.duplicates, 0);
  assert.ok(contiguous(processed, first), processed.slice(0, 20).map((e) => e.seq).join(","));
  assert.equal(processed.filter((e) => e.reason === "detach").length, 100);
  assert.equal(processed.filter((e) => e.reason === "shutdown").length, 200);
  assert.equal(observer.connections, 2);
  await resumed.close();
  again.close();
  gateway.close();
});

test("watchlist_observer_watches_and_resumes", async () => {
  const many = range(1500).map((i) => `w${String(i).padStart(4, "0")}`); // ~10 KB of uids: three frames
  const seen = (): Array<[Uid, string]> => got.map((e) => [e.uid, e.kind]);
  let gateway = await RawGateway.login(idled.address, "edge2");
  const observer = new Observer({ host: idled.address, name: "contacts", uids: many, backoff: FAST });
  const got = record(observer);
  observer.start();
  await observer.watch([]); // a round trip: the subscription is in place
  gateway.attach(["w0000", "x", "w1499"]);
  await until(() => got.length === 2, "2 events");
  await observer.watch(["x2"]);
  gateway.attach(["x2", "x3"]);
  await until(() => got.length === 3, "3 events");
  await observer.unwatch(["w0000"]);
  gateway.detach(["w0000", "w1499", "x2", "x3"]);
  await until(() => got.length === 5, "5 events");
  assert.deepEqual(seen(), [["w0000", "online"], ["w1499", "online"], ["x2", "online"], ["w1499", "offline"], ["x2", "offline"]]);
  assert.deepEqual(observer.watchlist, [...many.slice(1), "x2"]);
  await idled.restart(); // "x" goes offline (shutdown) and comes back: not watched
  await until(() => observer.connections === 2, "the observer reconnected");
  gateway = await RawGateway.login(idled.address, "edge2");
  gateway.attach(["w0001", "w0000", "w1499", "x2"]); // w0001 is in the first watch frame
  await until(() => got.length === 8, "8 events");
  assert.equal(observer.duplicates, 0);
  assert.deepEqual(seen().slice(5), [["w0001", "online"], ["w1499", "online"], ["x2", "online"]]);
  const seqs = got.map((e) => e.seq);
  assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b));
  // Resuming from a checkpoint replays with the list the new connection sends: its first part (w0001) travels
  // in watch frames that must precede the subscribe, or the replay would skip that uid's events.
  const checkpoint = observer.position!;
  await observer.close();
  gateway.detach(["w0001", "x"]);
  await gateway.sync();
  const resumed = new Observer({ host: idled.address, name: "contacts", uids: observer.watchlist!, after: checkpoint });
  const replayed = record(resumed);
  resumed.start();
  await until(() => replayed.length >= 1, "w0001's offline replayed");
  await resumed.query([]);
  assert.deepEqual(replayed.map((e) => [e.uid, e.kind, e.reason]), [["w0001", "offline", "detach"]]);
  await resumed.close();
  gateway.close();
});

test("query with last_seen: online users, their devices, the last activity of offline ones", async () => {
  const observer = new Observer({ host: idled.address, name: "who", subscribe: false }).start();
  const phone = new Session({ host: idled.address, uid: "gina", keepalive: 5, device: "phone" }).start();
  const plain = new Session({ host: idled.address, uid: 7, keepalive: 5 }).start();
  await Promise.all([phone.waitConnected(), plain.waitConnected()]);
  const before = Date.now() / 1000;
  await plain.close();
  const answer = await observer.query(["gina", 7, "7", "nobody"], { lastSeen: true });
  assert.deepEqual(answer.get("gina")?.devices, ["phone"]);
  assert.equal(answer.get("gina")?.online, true);
  assert.equal(answer.get(7)?.online, false); // the int uid 7 and the str uid "7" are two users
  assert.ok(Math.abs(answer.get(7)!.lastSeen! - before) < 5);
  assert.deepEqual(answer.get("7"), { online: false, lastSeen: null, devices: [] });
  assert.deepEqual(answer.get("nobody"), { online: false, lastSeen: null, devices: [] });
  assert.deepEqual(await observer.query([]), new Map());
  await phone.close();
  await observer.close();
});
