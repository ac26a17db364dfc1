// The frame decoder fed bytes by hand: splits anywhere, several frames per chunk, the limit checked from the
// prefix alone, and every kind of bad input a typed error (idled/protocol/framing.py's cases).
import { test } from "node:test";
import assert from "node:assert/strict";
import { encode, decode as plainDecode } from "@msgpack/msgpack";
import { FrameDecoder, encodeFrame, encodeBody, decodeBody, frameOf } from "../src/protocol/frame.js";
import { IdledError } from "../src/protocol/errors.js";

const raw = (value: unknown): Uint8Array => frameOf(encode(value));

test("a ping is the 13 bytes of docs/protocol.md", () => {
  assert.deepEqual([...encodeFrame({ op: "ping" })], [0, 0, 0, 9, 0x81, 0xa2, 0x6f, 0x70, 0xa4, 0x70, 0x69, 0x6e, 0x67]);
});

test("absent optional fields are left out, not sent as nil", () => {
  assert.deepEqual(plainDecode(encodeBody({ op: "login", uid: "a", token: undefined })), { op: "login", uid: "a" });
});



test("frames split at every byte and glued together decode in order", () => {
  const bytes = new Uint8Array([...raw({ op: "pong" }), ...raw({ op: "mark", t: 1.5 }), ...raw({ op: "pong" })]);
  for (let cut = 0; cut <= bytes.length; cut++) {
    const decoder = new FrameDecoder(4096);
    const got = [...decoder.push(bytes.subarray(0, cut)), ...decoder.push(bytes.subarray(cut))];
    assert.deepEqual(got, [{ op: "pong" }, { op: "mark", t: 1.5 }, { op: "pong" }], `cut at ${cut}`);
    assert.equal(decoder.buffered, 0);
  }
  const decoder = new FrameDecoder(4096);
  const one: unknown[] = [];
  for (const byte of bytes) one.push(...decoder.push(new Uint8Array([byte])));
  assert.equal(one.length, 3);
});

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    assert.ok(error instanceof IdledError, String(error));
    return error.code;
  }
  return "no error";
}

test("the limit is enforced from the prefix alone, before the body arrives", () => {
  const decoder = new FrameDecoder(100);
  assert.equal(code(() => decoder.push(new Uint8Array([0, 0, 0, 101]))), "too_large");
  assert.equal(code(() => decoder.push(raw({ op: "pong" }))), "too_large", "a failed decoder stays failed");
  assert.equal(code(() => new FrameDecoder(4096).push(new Uint8Array([0xff, 0xff, 0xff, 0xff]))), "too_large");
});

test("bad bodies are typed errors", () => {
  const push = (bytes: number[] | Uint8Array) => code(() => new FrameDecoder(4096).push(new Uint8Array(bytes)));
  assert.equal(push([0, 0, 0, 0]), "bad_frame"); // N = 0
  assert.equal(push([0, 0, 0, 2, 0xc0, 0xc0]), "bad_frame"); // trailing bytes
  assert.equal(push([0, 0, 0, 1, 0xc1]), "bad_frame"); // reserved byte
  assert.equal(push([0, 0, 0, 3, 0xd4, 0x05, 0x00]), "bad_frame"); // an ext type
  assert.equal(push([0, 0, 0, 2, 0x81, 0xa2]), "bad_frame"); // truncated inside
  assert.equal(push(raw([1, 2])), "bad_message"); // not a map
  assert.equal(push(raw({ op: "nope" })), "bad_message");
  assert.equal(push(raw({ op: "event", seq: "1" })), "bad_message");
  assert.equal(push(raw({ op: "error", reason: "no code" })), "bad_message");
});

test("good frames before a bad one in the same chunk are delivered, then the failure", () => {
  const decoder = new FrameDecoder(4096);
  const got = decoder.push(new Uint8Array([...raw({ op: "pong" }), 0, 0, 0, 0]));
  assert.deepEqual(got, [{ op: "pong" }]);
  assert.equal(decoder.failure?.code, "bad_frame");
  assert.equal(code(() => decoder.push(raw({ op: "pong" }))), "bad_frame");
});

test("unknown fields are kept and int and str uids stay apart in a status", () => {
  const event = decodeBody(encode({ op: "event", seq: 3, kind: "online", uid: 42, ts: 1.5, reason: "login",
    last_seen: 1.5, deadline: 3, detector: "wheel", future: [1] }));
  assert.equal(event.op, "event");
  assert.deepEqual((event as Record<string, unknown>).future, [1]);
  const bytes = new Uint8Array([0x82, 0xa2, 0x6f, 0x70, 0xa6, ...new TextEncoder().encode("status"), 0xa6,
    ...new TextEncoder().encode("online"), 0x82, 0x2a, 0xc3, 0xa2, 0x34, 0x32, 0xc2]); // {42: true, "42": false}
  const status = decodeBody(bytes);
  assert.ok(status.op === "status");
  assert.equal(status.online.get(42), true);
  assert.equal(status.online.get("42"), false);
});

test("the not_leader hint is parsed", () => {
  const error = decodeBody(encode({ op: "error", code: "not_leader", reason: "standby", leader: "127.0.0.2:7878" }));
  assert.deepEqual(error, { op: "error", code: "not_leader", reason: "standby", leader: "127.0.0.2:7878" });
});
