// Leader following against an elected pair (a real etcd, two `idled serve --election` cores): a session and
// an observer given both cores log in at the leader, follow a SIGKILL of it to the new leader, and the user
// is back online there with no idle offline; the observer's stream goes on from the new leader's log.
import { test } from "node:test";
import assert from "node:assert/strict";
import { until } from "./support/daemon.js";
import { Cluster, etcdBinary } from "./support/cluster.js";
import { record } from "./support/peers.js";
import { Observer, Session } from "../src/index.js";

const FAST = { base: 0.05, cap: 0.5 };

test("a session and an observer follow the leader across a SIGKILL", { skip: etcdBinary() === null ? "etcd not on PATH" : false }, async () => {
  const cluster = await new Cluster().start(2);
  try {
    const leader = await cluster.settled();
    const standby = 1 - leader;
    // The standby first: its not_leader names the leader, which the link follows at once.
    const hosts = [cluster.addresses[standby]!, cluster.addresses[leader]!];
    const observer = new Observer({ host: hosts, name: "follow", uids: ["carol"], backoff: FAST });
    const events = record(observer);
    observer.start();
    await observer.watch([]);
    const session = new Session({ host: hosts, uid: "carol", keepalive: 1, backoff: FAST });
    const hops: string[] = [];
    session.on("disconnected", ({ error }) => hops.push(error.code));
    session.start();
    await session.waitConnected();
    assert.equal(session.address, cluster.addresses[leader]);
    assert.deepEqual(hops, ["not_leader"]);
    await until(() => events.some((e) => e.kind === "online"), "carol online on the leader");
    const before = events.at(-1)!.seq;

    await cluster.kill(leader);
    await until(() => session.connections >= 2 && session.connected, "carol logged in on the new leader", 30);
    assert.equal(session.address, cluster.addresses[standby]);
    await until(() => events.some((e) => e.seq > before && e.kind === "online"), "carol back online, seen by the observer", 30);
    assert.equal(observer.address, cluster.addresses[standby]);
    assert.deepEqual(await observer.query(["carol"]), new Map([["carol", true]]));
    assert.ok(!events.some((e) => e.reason === "idle"), JSON.stringify(events));
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b));
    await session.close();
    await observer.close();
  } finally {
    await cluster.close();
  }
});
