// The chat example against a real `idled serve`: users connecting over WebSocket are online in idled (seen by
// a separate observer, not by the chat server), a message reaches the others, a closed socket is an offline,
// and stopping the chat server ends the rest. Needs the package built first (`npm run build` in clients/js).
import { test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import WebSocket from "ws";

import { startDaemon, until } from "../../dist/test/support/daemon.js";
import { Peek } from "../../dist/test/support/peek.js";
import { startChat } from "./server.mjs";

async function connect(port, query) {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/?${query}`);
  await once(ws, "open");
  return ws;
}

test("chat users are reported to idled by one gateway", async () => {
  const daemon = await startDaemon();
  const peek = await Peek.open(daemon.address);
  peek.subscribe(1);
  const chat = await startChat({ port: 0, idled: daemon.address, name: "chat-test", keepalive: 30 });
  try {
    const alice = await connect(chat.port, "user=alice&device=web");
    const bob = await connect(chat.port, "user=bob");
    const heard = once(bob, "message");
    alice.send("hello");
    assert.deepEqual(JSON.parse(String((await heard)[0])), { from: "alice", text: "hello" });
    const online = await peek.online(["alice", "bob", "carol"], (m) => m.get("alice") === true && m.get("bob") === true);
    assert.deepEqual([...online], [["alice", true], ["bob", true], ["carol", false]]);

    const refused = new WebSocket(`ws://127.0.0.1:${chat.port}/`); // no user: idled would refuse the key
    const [code] = await once(refused, "close");
    assert.equal(code, 4001);

    alice.close();
    await peek.eventsUntil((es) => es.some((e) => e.uid === "alice" && e.kind === "offline"), "alice offline");
    await chat.close(); // bob's socket goes with the server; the gateway logs out
    const events = await peek.eventsUntil((es) => es.some((e) => e.uid === "bob" && e.kind === "offline"), "bob offline");
    assert.deepEqual(events.map((e) => [e.uid, e.kind, e.reason, e.device]).filter(([uid]) => uid === "alice"), [
      ["alice", "online", "login", "web"], ["alice", "offline", "closed", "web"]]);
    assert.deepEqual(events.filter((e) => e.uid === "bob").map((e) => [e.kind]), [["online"], ["offline"]]);
    assert.equal(chat.gateway.connections, 1);
    await until(() => chat.gateway.done, "the gateway closed");
  } finally {
    await chat.close().catch(() => {});
    peek.close();
    await daemon.close();
  }
});
