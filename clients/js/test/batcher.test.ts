// The gateway batcher with plain values: the rules of idled/client/core.py's GatewayBatcher, mirrored from
// tests/client/test_core.py (test names as there where they apply).
import { test } from "node:test";
import assert from "node:assert/strict";
import { decode } from "@msgpack/msgpack";

import { GatewayBatcher, keyId } from "../src/core/batcher.js";
import { IdledError } from "../src/protocol/errors.js";
import { MAX_DEVICE_BYTES, MAX_UID_BYTES, type SessionKey } from "../src/protocol/messages.js";

const badMessage = (e: unknown): boolean => e instanceof IdledError && e.code === "bad_message";

function bodies(frames: Uint8Array[]): Record<string, unknown>[] {
  return frames.map((f) => decode(f) as Record<string, unknown>);
}

function liveKeys(batch: GatewayBatcher): [SessionKey, number | undefined][] {
  return [...batch.live.values()].map((s) => [s.key, s.keepalive]);
}

test("batcher_coalesces_touches_and_keeps_order", () => {
  const batch = new GatewayBatcher();
  batch.attach(["a", "b"], 10, 1.0);
  batch.touch(["a"], 1.1); // the pending attach is activity already
  assert.equal(batch.pending, 2);
  assert.equal(batch.firstPending, 1.0);
  for (let i = 0; i < 1000; i++) batch.touch(["c", "d"], 1.2);
  batch.detach(["a"], 1.3);
  batch.touch(["b"], 1.4);
  assert.deepEqual(bodies(batch.take()), [
    { op: "attach", uids: ["a", "b"], keepalive: 10 },
    { op: "touch", uids: ["c", "d"] },
    { op: "detach", uids: ["a"] },
    { op: "touch", uids: ["b"] },
  ]);
  assert.equal(batch.pending, 0);
  assert.equal(batch.firstPending, undefined);
  assert.deepEqual(batch.take(), []);
  assert.deepEqual(liveKeys(batch), [["b", 10]]);
});

test("batcher_splits_frames_under_the_limit_and_bounds_pending", () => {
  const batch = new GatewayBatcher(5000);
  const uids = Array.from({ length: 5000 }, (_, i) => i * 1_000_003); // up to 5 bytes each in msgpack
  batch.touch(uids, 0);
  assert.ok(batch.full);
  const frames = batch.take(4096);
  assert.ok(frames.length > 1);
  for (const f of frames) assert.ok(f.length <= 4096, `frame of ${f.length} bytes`);
  assert.deepEqual(bodies(frames).flatMap((b) => b.uids as number[]), uids);
  batch.touch(["x".repeat(256), "x".repeat(256), "x".repeat(256)], 0);
  assert.equal(batch.take(4096).length, 1); // the same key three times is one key
});

test("batcher_reattaches_live_uids_by_keepalive", () => {
  const batch = new GatewayBatcher();
  batch.attach([1, 2], 5, 0);
  batch.attach([3], undefined, 0);
  batch.detach([2], 0);
  batch.take();
  batch.touch([1], 1);
  batch.reattach(2);
  assert.equal(batch.firstPending, 2);
  assert.deepEqual(bodies(batch.take()), [{ op: "attach", uids: [1], keepalive: 5 }, { op: "attach", uids: [3] }]);
});

test("batcher_keeps_detach_reasons_apart_and_in_order", () => {
  const batch = new GatewayBatcher();
  batch.attach(["a", "b", "c"], 30, 0);
  assert.ok(batch.attaching);
  batch.detach(["a"], 0, "logout");
  batch.detach(["b"], 0, "logout");
  batch.detach(["c"], 0, "closed");
  batch.detach(["d"], 0);
  assert.deepEqual(bodies(batch.take()), [
    { op: "attach", uids: ["a", "b", "c"], keepalive: 30 },
    { op: "detach", uids: ["a", "b"], reason: "logout" },
    { op: "detach", uids: ["c"], reason: "closed" },
    { op: "detach", uids: ["d"] },
  ]);
  assert.ok(!batch.attaching);
  assert.equal(batch.live.size, 0);
  assert.throws(() => batch.detach(["a"], 0, "gone" as "logout"), badMessage);
});

test("batcher_forgets_uids_the_server_ended", () => {
  const batch = new GatewayBatcher();
  batch.attach([1, 2], 5, 0);
  batch.take();
  batch.forget([keyId(1), keyId(3)]);
  batch.reattach(1);
  assert.deepEqual(bodies(batch.take()), [{ op: "attach", uids: [2], keepalive: 5 }]);
});

test("batcher_refuses_a_keepalive_the_server_would_refuse", () => {
  const batch = new GatewayBatcher();
  for (const bad of [0.5, 86_401, Number.NaN]) {
    assert.throws(() => batch.attach(["a"], bad, 0), badMessage);
  }
  assert.equal(batch.pending, 0);
  assert.equal(batch.live.size, 0); // nothing recorded
});

test("batcher_carries_session_keys_as_uid_device_arrays_that_decode_back_to_the_keys", () => {
  const phone = ["alice", "phone"] as const;
  const laptop = ["alice", "laptop"] as const;
  const batch = new GatewayBatcher();
  batch.attach([phone, laptop, "bob", [7, "d0"]], 30, 0);
  batch.touch([["alice", "phone"]], 0.1); // an equal key (another array) is covered by the pending attach
  assert.deepEqual(bodies(batch.take()), [
    { op: "attach", uids: [["alice", "phone"], ["alice", "laptop"], "bob", [7, "d0"]], keepalive: 30 },
  ]);
  for (let i = 0; i < 100; i++) batch.touch([laptop, ["alice", "phone"]], 1);
  batch.detach([phone], 1.1, "logout");
  assert.deepEqual(bodies(batch.take()), [
    { op: "touch", uids: [["alice", "laptop"], ["alice", "phone"]] },
    { op: "detach", uids: [["alice", "phone"]], reason: "logout" },
  ]);
  assert.deepEqual(liveKeys(batch), [[laptop, 30], ["bob", 30], [[7, "d0"], 30]]);
  assert.equal(batch.live.get(keyId(["alice", "laptop"]))!.key, laptop, "the application's own key object");
  batch.forget([keyId(["alice", "laptop"])]); // the server ended it (idle, kicked): not re-attached
  batch.reattach(2);
  assert.deepEqual(bodies(batch.take()), [{ op: "attach", uids: ["bob", [7, "d0"]], keepalive: 30 }]);
});

test("a string uid, an integer uid and a device key never share an id", () => {
  const ids = [keyId("1"), keyId(1), keyId(["1", "a"]), keyId([1, "a"]), keyId('d["1","a"]'), keyId("s1")];
  assert.equal(new Set(ids).size, ids.length);
  assert.equal(keyId(["x", "y"]), keyId(["x", "y"]));
});

test("batcher_splits_frames_of_the_largest_keys_under_the_limit", () => {
  const big = "u".repeat(MAX_UID_BYTES);
  const key = [big, "d".repeat(MAX_DEVICE_BYTES)] as const; // the largest key there is
  const batch = new GatewayBatcher();
  const keys: SessionKey[] = Array.from({ length: 40 }, (_, i) => [big, String(i).padStart(64, "0")] as const);
  batch.touch([...keys, key], 0);
  const frames = batch.take(1024);
  assert.ok(frames.length > 10);
  for (const f of frames) assert.ok(f.length <= 1024, `frame of ${f.length} bytes`);
  assert.deepEqual(bodies(frames).flatMap((b) => b.uids as unknown[]).at(-1), [...key]);
  batch.touch([key], 0);
  assert.throws(() => batch.take(MAX_UID_BYTES + MAX_DEVICE_BYTES), RangeError); // not even one key fits
  // multi-byte UTF-8 is counted by its bytes, not its UTF-16 units
  batch.touch(Array.from({ length: 100 }, (_, i) => "é".repeat(60) + i), 0);
  for (const f of batch.take(1024)) assert.ok(f.length <= 1024, `frame of ${f.length} bytes`);
});

test("keys_and_devices_are_checked_where_the_application_hands_them_over", () => {
  assert.equal(keyId(42), 42);
  assert.equal(keyId("é".repeat(128)), "s" + "é".repeat(128)); // 256 bytes: the largest
  const batch = new GatewayBatcher();
  const bad: unknown[] = [
    "", "é".repeat(129), -1, 1.5, Number.MAX_SAFE_INTEGER + 1, Number.NaN, true, null, {},
    ["alice"], ["alice", "phone", "x"], ["alice", ""], ["alice", 3], ["", "phone"],
    ["alice", "x".repeat(MAX_DEVICE_BYTES + 1)], [1.5, "a"],
  ];
  for (const key of bad) {
    assert.throws(() => keyId(key as SessionKey), badMessage, JSON.stringify(key));
    assert.throws(() => batch.attach(["ok", key as SessionKey], 30, 0), badMessage);
    assert.throws(() => batch.touch([key as SessionKey], 0), badMessage);
  }
  assert.equal(batch.pending, 0); // a call with one bad key records nothing
  assert.equal(batch.live.size, 0);
});

test("maxPending must allow one key", () => {
  assert.throws(() => new GatewayBatcher(0), RangeError);
});
