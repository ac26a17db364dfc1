// slow_observer_is_cut_with_busy_and_resumes: an application whose event handler blocks the event loop for
// longer than the server's stall limit (5 s) reads nothing meanwhile; the server cuts the observer with
// `busy` (or the client finds the connection closed, a frame maybe cut short), and the observer resumes by
// seq: every event once, in order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { startDaemon, until } from "./support/daemon.js";
import { RawGateway, contiguous, range } from "./support/peers.js";
import { Observer } from "../src/index.js";
import type { PresenceEvent } from "../src/index.js";

const OBSERVER_STALL = 5; // idled/server/roles/observers.py
const n = 50_000;

/** 2n events published (n attaches, n detaches) before any observer reads a byte; the gateway, to close. */
async function published(address: string): Promise<RawGateway> {
  const gateway = await RawGateway.login(address, "edge");
  gateway.attach(range(n));
  gateway.detach(range(n));
  await gateway.sync();
  return gateway;
}

test("slow_observer_is_cut_with_busy_and_resumes", async (t) => {
  const idled = await startDaemon();
  try {
    const gateway = await published(idled.address);
    const observer = new Observer({ host: idled.address, name: "slow", after: 0, backoff: { base: 0.05, cap: 0.5 } });
    const events: PresenceEvent[] = [];
    let blocked = false;
    observer.on("event", (event) => {
      events.push(event);
      if (!blocked) {
        blocked = true;
        const end = Date.now() + (OBSERVER_STALL + 2) * 1000;
        while (Date.now() < end) {
          // a handler busy for 7 s: nothing is read meanwhile
        }
      }
    });
    observer.start();
    await until(() => events.length >= 2 * n, `${2 * n} events (${events.length})`, 60);
    assert.ok(["busy", "connection_lost"].includes(observer.lastError?.code ?? ""), String(observer.lastError));
    t.diagnostic(`cut by: ${observer.lastError?.message}; ${observer.connections} connections, ${observer.duplicates} duplicates dropped`);
    assert.ok(observer.connections >= 2, `${observer.connections} connections`);
    assert.ok(contiguous(events), "a gap or a duplicate");
    assert.equal(events.length, 2 * n);
    await observer.close();
    gateway.close();
  } finally {
    await idled.close();
  }
});

test("slow_observer_is_cut_with_busy_and_resumes, for await: a paused connection is cut and resumed", async (t) => {
  const idled = await startDaemon();
  try {
    const gateway = await published(idled.address);
    const observer = new Observer({ host: idled.address, name: "slow", after: 0, buffer: 16, backoff: { base: 0.05, cap: 0.5 } }).start();
    const events: PresenceEvent[] = [];
    for await (const event of observer) {
      events.push(event);
      if (events.length === 1) await new Promise((resolve) => setTimeout(resolve, (OBSERVER_STALL + 2) * 1000));
      if (event.seq >= 2 * n) break;
    }
    t.diagnostic(`cut by: ${observer.lastError?.message}; ${observer.connections} connections, ${observer.pauses} pauses`);
    assert.ok(observer.connections >= 2, `${observer.connections} connections`);
    assert.ok(contiguous(events), "a gap or a duplicate");
    assert.equal(events.length, 2 * n);
    await observer.close();
    gateway.close();
  } finally {
    await idled.close();
  }
});
