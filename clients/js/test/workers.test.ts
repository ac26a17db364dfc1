// Under `idled serve --workers 2` (edges in front of the core, one public port): a session's keepalives and
// bye travel through an edge; an observer's subscription is relayed to the core; both come back after the
// daemon restarts, the observer without a gap.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Daemon, startDaemon, sleep, until } from "./support/daemon.js";
import { record, contiguous } from "./support/peers.js";
import { Observer, Session } from "../src/index.js";

const FAST = { base: 0.05, cap: 0.5 };
let idled: Daemon;
before(async () => { idled = await startDaemon({ workers: 2 }); });
after(async () => { await idled.close(); });

test("session_keepalive_and_bye and sessions_come_back_after_a_restart under --workers 2", async () => {
  const observer = new Observer({ host: idled.address, name: "w", after: 0, backoff: FAST });
  const events = record(observer);
  observer.start();
  await observer.query([]); // subscribed (and caught up) before the logins
  const sessions = ["a", "b", "c"].map((uid) => new Session({ host: idled.address, uid, keepalive: 1, backoff: FAST }).start());
  await Promise.all(sessions.map((s) => s.waitConnected()));
  await sleep(2500); // past the 1.5 s timeout: the pings through the edges keep them online
  assert.deepEqual(await observer.query(["a", "b", "c"]), new Map([["a", true], ["b", true], ["c", true]]));
  await idled.restart();
  await until(() => sessions.every((s) => s.connections === 2 && s.connected) && observer.connections === 2, "all reconnected", 30);
  await until(() => events.filter((e) => e.kind === "online").length === 6, "the three back online", 30);
  await sessions[0]!.close();
  await until(() => events.some((e) => e.reason === "logout"), "a's logout");
  const mine = events.filter((e) => ["a", "b", "c"].includes(e.uid as string));
  assert.deepEqual(mine.filter((e) => e.kind === "offline").map((e) => e.reason).sort(), ["logout", "shutdown", "shutdown", "shutdown"]);
  assert.ok(contiguous(events, events[0]!.seq), events.map((e) => e.seq).join(","));
  await Promise.all(sessions.map((s) => s.close()));
  await observer.close();
});
