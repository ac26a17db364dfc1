// The Node gateway against an elected pair (a real etcd, two `idled serve --election` cores): given both
// cores, it logs in at the leader (the standby's not_leader names it), and after a SIGKILL of the leader it
// logs in at the new one and attaches every live session again: all online there, none ended idle.
import { test } from "node:test";
import assert from "node:assert/strict";
import { until } from "./support/daemon.js";
import { Cluster, etcdBinary } from "./support/cluster.js";
import { record } from "./support/peers.js";
import { Observer } from "../src/index.js";
import { openGateway } from "../src/gateway.js";
import type { SessionKey } from "../src/protocol/messages.js";

const FAST = { base: 0.05, cap: 0.5 };
const KEYS: SessionKey[] = [...Array.from({ length: 300 }, (_, i) => i), ["dana", "phone"], ["dana", "laptop"]];

test("a gateway follows the leader across a SIGKILL and re-attaches every live session", { skip: etcdBinary() === null ? "etcd not on PATH" : false }, async () => {
  const cluster = await new Cluster().start(2);
  try {
    const leader = await cluster.settled();
    const standby = 1 - leader;
    const hosts = [cluster.addresses[standby]!, cluster.addresses[leader]!];
    const observer = new Observer({ host: hosts, name: "follow", uids: [0, 299, "dana"], backoff: FAST });
    const events = record(observer);
    observer.start();
    await observer.watch([]);
    const ended: string[] = [];
    const gw = openGateway({ host: hosts, name: "edge", backoff: FAST, onEnded: (_, reason) => ended.push(reason) });
    await gw.waitConnected();
    assert.equal(gw.address, cluster.addresses[leader]);
    assert.equal(gw.lastError?.code, "not_leader");
    gw.attach(KEYS, 30);
    await gw.flush();
    await until(() => events.filter((e) => e.kind === "online").length === 3, "online on the leader");

    await cluster.kill(leader);
    await until(() => gw.connections >= 2 && gw.connected, "the gateway logged in at the new leader", 30);
    assert.equal(gw.address, cluster.addresses[standby]);
    assert.equal(gw.live, KEYS.length);
    await until(() => observer.connected && observer.address === cluster.addresses[standby], "the observer followed", 30);
    const uids = [...Array.from({ length: 300 }, (_, i) => i), "dana"];
    let online = new Map();
    for (let tries = 0; tries < 100; tries++) {
      online = await observer.query(uids);
      if ([...online.values()].every(Boolean)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal([...online.values()].filter(Boolean).length, uids.length);
    assert.ok(!events.some((e) => e.reason === "idle"), JSON.stringify(events));
    assert.ok(!ended.includes("idle"), ended.join());
    await gw.close();
    await observer.close();
  } finally {
    await cluster.close();
  }
});
