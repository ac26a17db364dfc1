/**
 * Gateway batching, sans-IO: the pending attach / touch / detach operations of a gateway and its live
 * sessions, turned into frames no larger than the connection's frame limit. A port of `GatewayBatcher` in
 * idled/client/core.py; nothing here reads a clock or a socket (times are arguments).
 *
 * Theory of operation
 * -------------------
 * *Session keys.* What a gateway reports is a session key: a uid (a string of 1..256 UTF-8 bytes, or an
 * integer 0..2**53-1 here: JavaScript numbers are exact up to there) or `[uid, device]` for one device of a
 * user (device: 1..64 UTF-8 bytes). A JavaScript array is not a value (two `["bob", "a"]` are different
 * objects), so each key is reduced to an *id* that is: the number itself for an integer uid, `"s" + uid` for
 * a string uid, `"d" + JSON.stringify([uid, device])` for a device key -- distinct for distinct keys, equal
 * for equal ones, and a cheap Map key. The batcher remembers the key object the application gave, so what
 * comes back (an `ended` notice) can be handed over as the application's own key.
 *
 * *Groups.* `attach` / `touch` / `detach` append to a list of groups; consecutive calls of the same kind (and
 * keepalive, or detach reason) share a group, an insertion-ordered Map used as a set, so repeated touches of
 * one key cost one Map lookup until the flush, and the order of an attach then a detach of one key is kept.
 * A touch of a key whose attach is still pending in the last group is dropped: the attach is activity.
 *
 * *Frames.* `take(maxFrame)` encodes the groups in order, each split into frames whose msgpack body stays
 * within `maxFrame` bytes (the `welcome`'s `max_frame`; 4096 before it): keys are counted by an upper bound
 * of their encoded size against `maxFrame` minus a generous fixed overhead for the op, the field names and
 * the keepalive, so a frame can never exceed the limit. `take` returns the msgpack bodies; the transport adds
 * the 4-byte length prefix (TCP) or sends each as one message (WebSocket).
 *
 * *Live sessions.* The batcher also remembers the live keys (attached, not detached, not ended by the server)
 * with their keepalive: after a reconnect the server has forgotten them (they went offline `gateway_lost`),
 * and `reattach(now)` replaces whatever was pending by attaches of all of them, grouped by keepalive.
 * `forget(keys)` drops keys the server ended itself (`idle`, `kicked`): they are not re-attached.
 *
 * *Limits.* `maxPending` bounds the keys buffered: `full` tells the driver to flush before accepting more,
 * so memory stays bounded however fast the application reports. `firstPending` is the time of the oldest
 * pending operation: the driver flushes at `firstPending + flushInterval`.
 */

import { ErrorCode, IdledError } from "../protocol/errors.js";
import { encodeBody } from "../protocol/frame.js";
import {
  DEFAULT_MAX_FRAME, MAX_DEVICE_BYTES, MAX_KEEPALIVE, MAX_UID_BYTES, MIN_KEEPALIVE,
} from "../protocol/messages.js";
import type { Attach, Detach, SessionKey, Touch } from "../protocol/messages.js";

/** The reduced form of a session key (see the theory of operation). */
export type KeyId = string | number;
export type DetachReason = NonNullable<Detach["reason"]>;

export const DEFAULT_FLUSH_INTERVAL = 0.05; // seconds a touch may wait for company before it is sent
export const DEFAULT_MAX_PENDING = 100_000; // keys buffered before a call flushes first
export const DETACH_REASONS: readonly DetachReason[] = ["logout", "closed", "shutdown"];
const FRAME_OVERHEAD = 64; // op, field names, keepalive or reason, array header: generous

/** UTF-8 length of `s` (exact, without allocating). */
export function utf8Length(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n += 4;
        i++;
      } else n += 3;
    } else n += 3;
  }
  return n;
}

function badKey(key: unknown, why: string): IdledError {
  let shown: string;
  try {
    shown = JSON.stringify(key) ?? String(key);
  } catch {
    shown = String(key);
  }
  return new IdledError(ErrorCode.BAD_MESSAGE, `bad session key ${shown}: ${why}`);
}

function checkUid(uid: unknown, key: unknown): void {
  if (typeof uid === "number") {
    if (!Number.isSafeInteger(uid) || uid < 0) throw badKey(key, "an integer uid must be 0..2**53-1");
  } else if (typeof uid === "string") {
    if (uid.length === 0 || (uid.length > MAX_UID_BYTES / 4 && utf8Length(uid) > MAX_UID_BYTES)) {
      throw badKey(key, `a string uid must be 1..${MAX_UID_BYTES} UTF-8 bytes`);
    }
  } else {
    throw badKey(key, "a uid is a string or an integer");
  }
}

/**
 * `key` reduced to its id, or an `IdledError` (`bad_message`) saying what is wrong with it -- raised where the application hands
 * the key over, rather than the server's `bad_message` (which closes the gateway's connection) on the wire.
 */
export function keyId(key: SessionKey): KeyId {
  if (typeof key === "string") {
    if (key.length === 0 || (key.length > MAX_UID_BYTES / 4 && utf8Length(key) > MAX_UID_BYTES)) checkUid(key, key);
    return "s" + key;
  }
  if (typeof key === "number") {
    if (!Number.isSafeInteger(key) || key < 0) checkUid(key, key);
    return key;
  }
  if (!Array.isArray(key) || key.length !== 2) throw badKey(key, "a key is a uid or [uid, device]");
  const [uid, device] = key as readonly unknown[];
  checkUid(uid, key);
  if (typeof device !== "string" || device.length === 0
      || (device.length > MAX_DEVICE_BYTES / 4 && utf8Length(device) > MAX_DEVICE_BYTES)) {
    throw badKey(key, `a device is a string of 1..${MAX_DEVICE_BYTES} UTF-8 bytes`);
  }
  return "d" + JSON.stringify(key);
}

/** Upper bound of a key's msgpack size: a uid, or the 2-array [uid, device]. */
function keySize(key: SessionKey): number {
  if (typeof key === "number") return 9;
  if (typeof key === "string") return utf8Length(key) + 3;
  const uid = key[0];
  return 1 + (typeof uid === "number" ? 9 : utf8Length(uid) + 3) + utf8Length(key[1]) + 3;
}

/** The largest key there is: a frame limit must hold at least one. */
const LARGEST_KEY = 1 + MAX_UID_BYTES + 3 + MAX_DEVICE_BYTES + 3;

type Op = "attach" | "touch" | "detach";

class Group {
  readonly keys = new Map<KeyId, SessionKey>();
  constructor(readonly op: Op, readonly keepalive: number | undefined, readonly reason: DetachReason | undefined) {}

  /** The msgpack body of one frame of this group carrying `uids`. */
  body(uids: SessionKey[]): Uint8Array {
    if (this.op === "attach") {
      const attach: Attach = this.keepalive === undefined ? { op: "attach", uids } : { op: "attach", uids, keepalive: this.keepalive };
      return encodeBody(attach);
    }
    if (this.op === "touch") return encodeBody({ op: "touch", uids } satisfies Touch);
    const detach: Detach = this.reason === undefined ? { op: "detach", uids } : { op: "detach", uids, reason: this.reason };
    return encodeBody(detach);
  }
}

/** A live session: its key as the application gave it, and its keepalive. */
export interface LiveSession {
  readonly key: SessionKey;
  readonly keepalive: number | undefined;
}

/** Pending gateway operations and the live sessions; see the theory of operation. */
export class GatewayBatcher {
  readonly maxPending: number;
  /** Live sessions by key id: attached, not detached, not ended by the server. */
  readonly live = new Map<KeyId, LiveSession>();
  /** Keys buffered (after deduplication). */
  pending = 0;
  /** Time of the oldest pending operation, or undefined when nothing is pending. */
  firstPending: number | undefined = undefined;
  private groups: Group[] = [];

  constructor(maxPending: number = DEFAULT_MAX_PENDING) {
    if (!(maxPending >= 1)) throw new RangeError("maxPending must be at least 1");
    this.maxPending = maxPending;
  }

  get full(): boolean {
    return this.pending >= this.maxPending;
  }

  /** Whether an attach is pending. */
  get attaching(): boolean {
    return this.groups.some((g) => g.op === "attach");
  }

  private group(op: Op, keepalive: number | undefined, reason: DetachReason | undefined, now: number): Group {
    const groups = this.groups;
    const last = groups[groups.length - 1];
    if (last !== undefined && last.op === op && last.keepalive === keepalive && last.reason === reason) return last;
    const group = new Group(op, keepalive, reason);
    groups.push(group);
    if (this.firstPending === undefined) this.firstPending = now;
    return group;
  }

  private add(group: Group, id: KeyId, key: SessionKey): void {
    const keys = group.keys;
    if (!keys.has(id)) {
      keys.set(id, key);
      this.pending++;
    }
  }

  /** These sessions connected (their timeout from `keepalive`, seconds; undefined: the server's default). */
  attach(keys: readonly SessionKey[], keepalive: number | undefined, now: number): void {
    // Checked here, where the caller can see it: the server answers a bad keepalive by closing the
    // connection, and the reconnect would send the same attach again.
    if (keepalive !== undefined && !(keepalive >= MIN_KEEPALIVE && keepalive <= MAX_KEEPALIVE)) {
      throw new IdledError(ErrorCode.BAD_MESSAGE, `keepalive must be within ${MIN_KEEPALIVE}..${MAX_KEEPALIVE} seconds, got ${keepalive}`);
    }
    const ids = keys.map(keyId); // every key checked before anything is recorded
    const group = this.group("attach", keepalive, undefined, now);
    for (let i = 0; i < ids.length; i++) {
      const key = keys[i]!;
      this.live.set(ids[i]!, { key, keepalive });
      this.add(group, ids[i]!, key);
    }
  }

  /** Activity from these sessions. */
  touch(keys: readonly SessionKey[], now: number): void {
    const ids = keys.map(keyId);
    const groups = this.groups;
    const last = groups[groups.length - 1];
    const attached = last !== undefined && last.op === "attach" ? last.keys : undefined;
    let group: Group | undefined;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (attached !== undefined && attached.has(id)) continue; // the pending attach is activity already
      group ??= this.group("touch", undefined, undefined, now);
      this.add(group, id, keys[i]!);
    }
  }

  /** These sessions disconnected; `reason` (one of `DETACH_REASONS`) is the offline reason to record. */
  detach(keys: readonly SessionKey[], now: number, reason?: DetachReason): void {
    if (reason !== undefined && !DETACH_REASONS.includes(reason)) {
      throw new IdledError(ErrorCode.BAD_MESSAGE, `a detach reason is one of ${DETACH_REASONS.join(", ")}, got ${reason}`);
    }
    const ids = keys.map(keyId);
    const group = this.group("detach", undefined, reason, now);
    for (let i = 0; i < ids.length; i++) {
      this.live.delete(ids[i]!);
      this.add(group, ids[i]!, keys[i]!);
    }
  }

  /** The server ended these sessions itself (`idle`, `kicked`): no longer live, not re-attached. */
  forget(ids: Iterable<KeyId>): void {
    for (const id of ids) this.live.delete(id);
  }

  /**
   * Every pending operation as frame bodies (msgpack, without the length prefix the transport adds) of at most
   * `maxFrame` bytes, in order; clears them.
   */
  take(maxFrame: number = DEFAULT_MAX_FRAME): Uint8Array[] {
    const budget = maxFrame - FRAME_OVERHEAD;
    if (budget < LARGEST_KEY) throw new RangeError(`max_frame ${maxFrame} is too small for a gateway frame`);
    const frames: Uint8Array[] = [];
    for (const group of this.groups) {
      let chunk: SessionKey[] = [];
      let size = 0;
      for (const key of group.keys.values()) {
        const n = keySize(key);
        if (size + n > budget) {
          frames.push(group.body(chunk));
          chunk = [];
          size = 0;
        }
        chunk.push(key);
        size += n;
      }
      if (chunk.length > 0) frames.push(group.body(chunk));
    }
    this.clear();
    return frames;
  }

  /** Drop what is pending without encoding it (disconnected: the next `reattach` replaces it anyway). */
  discard(): void {
    this.clear();
  }

  private clear(): void {
    this.groups = [];
    this.pending = 0;
    this.firstPending = undefined;
  }

  /** After a reconnect: drop what was pending; attach every live session again, grouped by keepalive. */
  reattach(now: number): void {
    this.clear();
    const byKeepalive = new Map<number | undefined, Group>();
    for (const [id, session] of this.live) {
      let group = byKeepalive.get(session.keepalive);
      if (group === undefined) {
        group = new Group("attach", session.keepalive, undefined);
        byKeepalive.set(session.keepalive, group);
        this.groups.push(group);
        this.firstPending ??= now;
      }
      this.add(group, id, session.key);
    }
  }
}
