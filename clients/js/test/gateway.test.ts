// The Node gateway against real daemons (`idled serve`, and `--workers 2` where the gateway goes through an
// edge): the scenarios of tests/client/scenarios.py that concern gateways, under the same names; presence is
// checked by a separate raw observer (support/peek.ts), never by the gateway under test.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { Daemon, freePort, startDaemon, until, sleep } from "./support/daemon.js";
import { Peek, userLogin } from "./support/peek.js";
import { openGateway, type Gateway, type GatewayOptions } from "../src/gateway.js";
import { IdledError } from "../src/protocol/errors.js";
import { nodeConnector } from "../src/transport/node.js";
import type { SessionKey, Uid } from "../src/protocol/messages.js";

const FAST = { base: 0.05, cap: 0.5 }; // reconnect quickly: the tests restart daemons

function gateway(daemon: Daemon, options: Partial<GatewayOptions> = {}): Gateway {
  return openGateway({ host: daemon.address, name: "edge", backoff: FAST, ...options });
}

const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, i) => from + i);
const badMessage = (e: unknown): boolean => e instanceof IdledError && e.code === "bad_message";

async function gatewayBatchesTouches(daemon: Daemon): Promise<void> {
  const gw = gateway(daemon, { flushInterval: 0.5 });
  const peek = await Peek.open(daemon.address);
  try {
    await gw.waitConnected();
    gw.attach(range(0, 1000), 30);
    await gw.flush();
    const before = gw.framesSent;
    for (let i = 0; i < 10_000; i++) gw.touch([i % 1000]);
    await until(() => gw.batch.pending === 0, "the background flush");
    const touchFrames = gw.framesSent - before;
    assert.ok(touchFrames >= 1 && touchFrames <= 3, `${touchFrames} touch frames`);
    gw.detach(range(0, 500));
    await gw.flush();
    const online = await peek.online(range(0, 1000), (m) => [...m.values()].filter(Boolean).length === 500);
    assert.deepEqual([...online].filter(([, on]) => on).map(([uid]) => uid), range(500, 1000));
    assert.equal(gw.live, 500);
  } finally {
    await gw.close();
    peek.close();
  }
}

async function gatewayReportsSessionKeys(daemon: Daemon): Promise<void> {
  const heard: [SessionKey[], string][] = [];
  const gw = gateway(daemon, { onEnded: (keys, reason) => heard.push([keys, reason]) });
  const peek = await Peek.open(daemon.address);
  peek.subscribe(1); // from the first event (and filtered): a subscription from now may start late through an edge
  try {
    await gw.waitConnected();
    assert.throws(() => gw.attach([["bob", ""]]), badMessage);
    assert.throws(() => gw.attach([["bob", "a", "b"] as unknown as SessionKey]), badMessage);
    const carol = ["carol", "x"] as const;
    gw.attach([["bob", "a"], ["bob", "b"]], 30);
    gw.attach([carol], 1); // never touched: its key ends idle
    await gw.flush();
    await until(() => heard.length === 1, "carol's idle notice");
    assert.deepEqual(heard, [[[["carol", "x"]], "idle"]]);
    assert.equal(heard[0]![0][0], carol, "the notice hands back the application's own key");
    gw.touch([["bob", "a"]]);
    gw.detach([["bob", "a"]]);
    await gw.flush();
    assert.deepEqual(await peek.query(["bob", "carol"]), new Map<Uid, boolean>([["bob", true], ["carol", false]]));
    gw.detach([["bob", "b"]]);
    const events = (await peek.eventsUntil((es) => es.some((e) => e.uid === "bob" && e.kind === "offline"), "bob offline"))
      .filter((e) => e.uid === "bob" || e.uid === "carol");
    assert.deepEqual(events.map((e) => [e.uid, e.kind, e.reason, e.device]), [
      ["bob", "online", "login", "a"], ["carol", "online", "login", "x"], ["carol", "offline", "idle", "x"],
      ["bob", "offline", "detach", "b"]]);
    assert.equal(gw.live, 0);
  } finally {
    await gw.close();
    peek.close();
  }
}

async function gatewayAnswersMarks(daemon: Daemon): Promise<void> {
  const heard: [SessionKey[], string][] = [];
  const gw = gateway(daemon, { marks: true, onEnded: (keys, reason) => heard.push([keys, reason]) });
  const peek = await Peek.open(daemon.address);
  try {
    await gw.waitConnected();
    gw.attach(["talk", "quiet"], 1); // timeout 1.5 s
    for (let i = 0; i < 8; i++) {
      await sleep(500);
      gw.touch(["talk"]);
    }
    await until(() => heard.length > 0, "quiet's idle notice");
    assert.deepEqual(heard, [[["quiet"], "idle"]]);
    assert.deepEqual(await peek.query(["talk", "quiet"]), new Map<Uid, boolean>([["talk", true], ["quiet", false]]));
    assert.equal(gw.connections, 1);
    assert.equal(gw.lastError, null, "every answer was accepted");
  } finally {
    await gw.close();
    peek.close();
  }
}

for (const workers of [0, 2]) {
  describe(workers ? `through an edge (--workers ${workers})` : "idled serve", () => {
    let daemon: Daemon;
    before(async () => { daemon = await startDaemon({ workers }); });
    after(async () => { await daemon.close(); });
    test("gateway_batches_touches", () => gatewayBatchesTouches(daemon));
    test("gateway_reports_session_keys", () => gatewayReportsSessionKeys(daemon));
    test("gateway_answers_marks", () => gatewayAnswersMarks(daemon));
  });
}

describe("restarts", () => {
  let daemon: Daemon;
  // The smallest gateway frame limit: the welcome says so, and a re-attach of thousands takes many frames.
  before(async () => { daemon = await startDaemon({ args: ["--max-gateway-frame", "4096"] }); });
  after(async () => { await daemon.close(); });

  test("gateway_hears_which_sessions_ended", async () => {
    const heard: [SessionKey[], string][] = [];
    const gw = gateway(daemon, { onEnded: (keys, reason) => heard.push([keys, reason]) });
    const peek = await Peek.open(daemon.address);
    try {
      await gw.waitConnected();
      assert.throws(() => gw.attach(["quiet"], 0.5), badMessage); // below the protocol's minimum: refused locally
      gw.attach(["quiet"], 1); // timeout 1.5 s, and never touched
      gw.attach(["taken", "stays"], 30);
      await gw.flush();
      const user = await userLogin(daemon.address, "taken"); // newest login wins
      await until(() => heard.length >= 2, "two notices");
      user.close();
      assert.deepEqual([...heard].sort(), [[["quiet"], "idle"], [["taken"], "kicked"]]);
      assert.deepEqual([...gw.batch.live.values()].map((s) => s.key), ["stays"]); // not re-attached later
      peek.close();
      await daemon.restart();
      await until(() => gw.connections === 2, "the reconnect");
      assert.deepEqual(heard.slice(2), [[["stays"], "shutdown"]]);
      // the server's `server_shutdown`, or a refused reconnect while it restarted
      assert.ok(["server_shutdown", "connection_lost"].includes(gw.lastError?.code ?? ""), String(gw.lastError));
      const again = await Peek.open(daemon.address);
      const online = await again.online(["quiet", "taken", "stays"], (m) => m.get("stays") === true);
      again.close();
      assert.deepEqual(online, new Map<Uid, boolean>([["quiet", false], ["taken", false], ["stays", true]]));
    } finally {
      await gw.close();
      peek.close();
    }
  });

  test("sessions_come_back_after_a_restart (a gateway's 3,000, re-attached in frames under its limit)", async () => {
    const gw = gateway(daemon);
    try {
      await gw.waitConnected();
      gw.attach(range(0, 3000), 5); // several frames of the re-attach under a small limit
      await gw.flush();
      const first = await Peek.open(daemon.address);
      await first.online([0, 2999], (m) => m.get(0) === true && m.get(2999) === true);
      first.close();
      const connections = gw.connections;
      const framesBefore = gw.framesSent;
      await daemon.restart();
      await until(() => gw.connections === connections + 1, "the reconnect");
      assert.equal(gw.maxFrame, 4096);
      assert.ok(gw.framesSent - framesBefore >= 7, `${gw.framesSent - framesBefore} frames`); // 3,000 keys
      const peek = await Peek.open(daemon.address);
      const online = await peek.online(range(0, 3000), (m) => [...m.values()].every(Boolean));
      peek.close();
      assert.equal([...online.values()].filter(Boolean).length, 3000);
    } finally {
      await gw.close();
    }
  });
});

test("a closed gateway takes detaches (its sessions ended with it) and refuses the rest", async () => {
  const daemon = await startDaemon();
  try {
    const gw = gateway(daemon);
    await gw.waitConnected();
    gw.attach(["a"], 30);
    await gw.close();
    assert.equal(gw.done, true);
    gw.detach(["a"]); // e.g. a socket's close handler running after the server's shutdown
    assert.throws(() => gw.detach([["a", ""]]), badMessage);
    assert.throws(() => gw.touch(["a"]), (e: unknown) => e instanceof IdledError && e.code === "connection_lost");
    assert.throws(() => gw.attach(["b"]), (e: unknown) => e instanceof IdledError && e.code === "connection_lost");
    await assert.rejects(gw.flush(), (e: unknown) => e instanceof IdledError && e.code === "connection_lost");
  } finally {
    await daemon.close();
  }
});

describe("refusals", () => {
  test("auth_failed_is_final (a gateway; a token function is called per login)", async () => {
    const daemon = await startDaemon({ auth: true });
    try {
      const gw = openGateway({ host: daemon.address, name: "edge", token: "not-a-token", backoff: FAST });
      await assert.rejects(gw.waitConnected(), (e: unknown) => e instanceof IdledError && e.code === "auth_failed");
      assert.equal(gw.done, true);
      assert.equal(gw.connections, 0);
      assert.throws(() => gw.touch(["a"]), (e: unknown) => e instanceof IdledError && e.code === "auth_failed");
      const ok = openGateway({ host: daemon.address, name: "edge", token: () => daemon.token("gateway", "edge") });
      await ok.waitConnected();
      await ok.close();
      assert.equal(ok.error, null);
    } finally {
      await daemon.close();
    }
  });

  test("a standby's not_leader names the leader, and the gateway goes there at once", async () => {
    const leader = await startDaemon();
    const standby = await startDaemon({ args: ["--standby-of", leader.address] });
    try {
      const dead = `127.0.0.1:${await freePort()}`; // listed between them: the hint skips it
      const tried: string[] = [];
      const tcp = nodeConnector();
      const gw = openGateway({
        host: [standby.address, dead, leader.address], name: "edge", backoff: { base: 5, cap: 5 },
        connector: (address) => { tried.push(address); return tcp(address); },
      });
      const started = Date.now();
      await gw.waitConnected();
      assert.ok(Date.now() - started < 3000, "no backoff between the members of one round");
      assert.equal(gw.lastError?.code, "not_leader");
      assert.deepEqual(tried, [standby.address, leader.address]);
      gw.attach(["x"], 30);
      await gw.flush();
      const peek = await Peek.open(leader.address);
      assert.deepEqual(await peek.online(["x"], (m) => m.get("x") === true), new Map<Uid, boolean>([["x", true]]));
      peek.close();
      await gw.close();
    } finally {
      await standby.close();
      await leader.close();
    }
  });
});
