// The TCP transport against a real `idled serve`: a login is welcomed, a ping answered, and an error frame
// arrives as a message before the close.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Daemon, startDaemon } from "./support/daemon.js";
import { nodeConnector } from "../src/transport/node.js";
import { encodeBody } from "../src/protocol/frame.js";
import type { ServerMessage } from "../src/protocol/messages.js";
import type { Transport } from "../src/transport/transport.js";

let daemon: Daemon;
before(async () => { daemon = await startDaemon(); });
after(async () => { await daemon.close(); });

function next(transport: Transport, messages: ServerMessage[]): Promise<ServerMessage> {
  return new Promise((resolve) => {
    if (messages.length > 0) return resolve(messages.shift()!);
    transport.onMessage = (m) => resolve(m);
  });
}

test("a TCP login is welcomed and a ping is answered", async () => {
  const transport = await nodeConnector()(daemon.address);
  const got: ServerMessage[] = [];
  transport.send(encodeBody({ op: "login", uid: "alice", keepalive: 2 }));
  const welcome = await next(transport, got);
  assert.deepEqual(welcome, { op: "welcome", uid: "alice", timeout: 3 });
  transport.send(encodeBody({ op: "ping" }));
  assert.deepEqual(await next(transport, got), { op: "pong" });
  const closed = new Promise((r) => { transport.onClose = r; });
  transport.close();
  await closed;
  assert.equal(transport.send(encodeBody({ op: "ping" })), false);
});

test("an error frame is a message, then the connection closes", async () => {
  const transport = await nodeConnector()(daemon.address);
  transport.send(encodeBody({ op: "ping" }));
  const closed = new Promise<unknown>((r) => { transport.onClose = r; });
  const error = await new Promise<ServerMessage>((r) => { transport.onMessage = r; });
  assert.equal(error.op, "error");
  assert.equal((error as { code: string }).code, "not_logged_in");
  assert.equal(((await closed) as { code: string }).code, "connection_lost");
});

test("a refused connect is a retryable connection_lost that says so", async () => {
  await assert.rejects(nodeConnector()("127.0.0.1:1"), (error: { code: string; refused: boolean; retryable: boolean }) =>
    error.code === "connection_lost" && error.refused && error.retryable);
});

test("messages and the end that arrive before the handlers are set are held, messages first", async () => {
  const { BaseTransport } = await import("../src/transport/transport.js");
  const { connectionLost } = await import("../src/protocol/errors.js");
  class Early extends BaseTransport {
    readonly remote = "early";
    send(): boolean { return false; }
    close(): void {}
    get bufferedAmount(): number { return 0; }
    arrive(): void {
      this.onMessage({ op: "pong" });
      this.finish(connectionLost("gone"));
    }
  }
  for (const order of ["close first", "message first"]) {
    const early = new Early();
    early.arrive();
    const seen: string[] = [];
    if (order === "close first") early.onClose = (e) => seen.push(e.code);
    early.onMessage = (m) => seen.push(m.op);
    if (order === "message first") early.onClose = (e) => seen.push(e.code);
    assert.deepEqual(seen, ["pong", "connection_lost"], order);
  }
});
