// gone_says_the_oldest_seq and auth_failed_is_final: daemons of their own (tiny log segments; auth on).
import { test } from "node:test";
import assert from "node:assert/strict";
import { startDaemon } from "./support/daemon.js";
import { RawGateway, collect, range } from "./support/peers.js";
import { Observer, Session } from "../src/index.js";
import type { IdledError } from "../src/index.js";

test("gone_says_the_oldest_seq", async () => {
  const idled = await startDaemon({ args: ["--segment-bytes", "4096", "--retention-bytes", "8192"] });
  try {
    const gateway = await RawGateway.login(idled.address, "edge");
    for (let i = 0; i < 5; i++) {
      gateway.attach(range(200));
      gateway.detach(range(200));
    }
    await gateway.sync();
    gateway.close();
    await new Promise((r) => setTimeout(r, 500));
    await idled.restart(); // the memory window emptied: events older than the log's retention are gone
    const late = new Observer({ host: idled.address, name: "late", after: 0, backoff: { base: 0.05, cap: 0.5 } }).start();
    const error = await late.wait().then(() => null, (e: IdledError) => e);
    assert.equal(error?.code, "gone");
    assert.equal(error?.retryable, false);
    const oldest = error!.oldestSeq!;
    assert.ok(oldest > 1, `oldest ${oldest}`);
    const again = new Observer({ host: idled.address, name: "late", after: oldest - 1 }).start();
    const [event] = await collect(again, () => true);
    assert.equal(event!.seq, oldest);
    await again.close();
  } finally {
    await idled.close();
  }
});

test("auth_failed_is_final", async () => {
  const idled = await startDaemon({ auth: true });
  try {
    const forged = idled.token("uid", "mallory").replace(/.$/, (c) => (c === "A" ? "B" : "A"));
    const bad = new Session({ host: idled.address, uid: "mallory", token: forged, backoff: { base: 0.05, cap: 0.5 } }).start();
    await assert.rejects(bad.wait(), (e: IdledError) => e.code === "auth_failed" && !e.retryable);
    assert.equal(bad.connections, 0);
    const other = new Session({ host: idled.address, uid: "alice", token: idled.token("uid", "mallory") }).start();
    await assert.rejects(other.wait(), (e: IdledError) => e.code === "auth_failed"); // another uid's token
    const good = new Session({ host: idled.address, uid: "alice", token: () => idled.token("uid", "alice") }).start();
    await good.waitConnected();
    assert.equal(good.connections, 1);
    const observer = new Observer({ host: idled.address, name: "dash", token: idled.token("observer", "dash"), subscribe: false }).start();
    assert.deepEqual(await observer.query(["alice"]), new Map([["alice", true]]));
    await observer.close();
    await good.close();
  } finally {
    await idled.close();
  }
});
