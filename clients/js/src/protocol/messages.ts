/**
 * The wire protocol's messages, with the field names of docs/protocol.md and idled/protocol/messages.py.
 *
 * Client messages are the very objects that go on the wire (msgpack maps with an `op`); optional fields are
 * left out when absent. Server messages are checked leniently by `parseServerMessage`, as the contract asks of
 * clients: a known `op` with its required fields of the right types is accepted, fields this client does not
 * know are kept untouched (the server may add some, e.g. to `event`), and anything else is a `bad_message`.
 *
 * Uids are strings or integers and are kept as given: 42 and "42" are different uids. JavaScript numbers hold
 * integers exactly up to 2^53 - 1, so integer uids beyond `Number.MAX_SAFE_INTEGER` are refused by
 * `checkUid` (the protocol allows up to 2^63 - 1: use string uids for such ids).
 */

import { IdledError, ErrorCode } from "./errors.js";

export const DEFAULT_MAX_FRAME = 4096; // bytes of msgpack body (the 4-byte prefix is not counted)
export const CLIENT_MAX_FRAME = 1 << 24; // the largest frame this client accepts from a server
export const MAX_UID_BYTES = 256;
export const MAX_DEVICE_BYTES = 64;
export const MAX_NAME_BYTES = 128;
export const MAX_TOKEN_CHARS = 1024;
export const MIN_KEEPALIVE = 1;
export const MAX_KEEPALIVE = 86400;
export const DEFAULT_PORT = 7878;

export type Uid = string | number;
/** A session key: a plain uid, or [uid, device] for one device of a user. */
export type SessionKey = Uid | readonly [Uid, string];

// ---------------------------------------------------------------------------------------- client -> server

export interface UserLogin { op: "login"; uid: Uid; token?: string; keepalive?: number; device?: string }
export interface GatewayLogin { op: "login"; gateway: string; token?: string; ended?: boolean; marks?: boolean }
export interface ObserverLogin { op: "login"; observer: string; token?: string }
export type Login = UserLogin | GatewayLogin | ObserverLogin;
export interface Ping { op: "ping" }
export interface Msg { op: "msg"; data?: unknown }
export interface Bye { op: "bye" }
export interface Attach { op: "attach"; uids: readonly SessionKey[]; keepalive?: number }
// `ago`: seconds since the gateway read that activity; send it only to a server whose welcome says `ages` (docs/protocol.md).
export interface Touch { op: "touch"; uids: readonly SessionKey[]; ago?: number }
export interface Detach { op: "detach"; uids: readonly SessionKey[]; reason?: "logout" | "closed" | "shutdown" }
export interface Marked { op: "marked"; t: number }
export interface Subscribe { op: "subscribe"; from?: number; durable?: boolean; uids?: readonly Uid[] }
export interface Watch { op: "watch"; uids: readonly Uid[] }
export interface Unwatch { op: "unwatch"; uids: readonly Uid[] }
export interface Query { op: "query"; uids: readonly Uid[]; last_seen?: boolean }

export type ClientMessage =
  | Login | Ping | Msg | Bye | Attach | Touch | Detach | Marked | Subscribe | Watch | Unwatch | Query;

// ---------------------------------------------------------------------------------------- server -> client

export interface Welcome {
  op: "welcome";
  uid?: Uid;
  gateway?: string;
  observer?: string;
  /** A user's own timeout (s); for a gateway the server's default timeout. */
  timeout?: number;
  /** The connection's frame limit from now on. */
  max_frame?: number;
  tick?: number;
  max_timeout?: number;
  [extra: string]: unknown;
}
export interface Pong { op: "pong" }
export interface PresenceEvent {
  op: "event";
  seq: number;
  kind: "online" | "offline";
  uid: Uid;
  ts: number;
  reason: string;
  last_seen: number;
  deadline: number;
  device?: string;
  grace?: number;
  timeout?: number;
  [extra: string]: unknown;
}
export interface Status {
  op: "status";
  /** Keyed by the uids as queried (42 and "42" are different keys, hence a Map). */
  online: Map<Uid, boolean>;
  last_seen?: Map<Uid, number | null>;
  devices?: Map<Uid, string[]>;
}
export interface ErrorMessage { op: "error"; code: string; reason: string; leader?: string }
export interface Ended { op: "ended"; uids: SessionKey[]; reason: string }
export interface Mark { op: "mark"; t: number }

export type ServerMessage = Welcome | Pong | PresenceEvent | Status | ErrorMessage | Ended | Mark;

// ----------------------------------------------------------------------------------------------- checks

const encoder = new TextEncoder();

function bad(reason: string): IdledError {
  return new IdledError(ErrorCode.BAD_MESSAGE, reason);
}

function utf8Length(text: string): number {
  return encoder.encode(text).length;
}

/** `uid` if the server accepts it, else a `bad_message` IdledError (thrown where the caller sees it). */
export function checkUid(uid: unknown): Uid {
  if (typeof uid === "string") {
    const n = utf8Length(uid);
    if (n >= 1 && n <= MAX_UID_BYTES) return uid;
    throw bad(`a str uid is 1..${MAX_UID_BYTES} UTF-8 bytes, got ${n}`);
  }
  if (typeof uid === "number" && Number.isSafeInteger(uid) && uid >= 0) return uid;
  throw bad(`a uid is a string or an integer 0 <= x <= ${Number.MAX_SAFE_INTEGER}, got ${String(uid)}`);
}

export function checkDevice(device: unknown): string {
  if (typeof device === "string") {
    const n = utf8Length(device);
    if (n >= 1 && n <= MAX_DEVICE_BYTES) return device;
  }
  throw bad(`a device is a string of 1..${MAX_DEVICE_BYTES} UTF-8 bytes, got ${JSON.stringify(device)}`);
}

export function checkKeepalive(keepalive: unknown): number {
  if (typeof keepalive === "number" && keepalive >= MIN_KEEPALIVE && keepalive <= MAX_KEEPALIVE) return keepalive;
  throw bad(`keepalive must be within ${MIN_KEEPALIVE}..${MAX_KEEPALIVE} seconds, got ${String(keepalive)}`);
}

export function checkName(name: unknown, role: string): string {
  if (typeof name === "string") {
    const n = utf8Length(name);
    if (n >= 1 && n <= MAX_NAME_BYTES) return name;
  }
  throw bad(`a ${role} name is a string of 1..${MAX_NAME_BYTES} UTF-8 bytes, got ${JSON.stringify(name)}`);
}

// --------------------------------------------------------------------------------- parsing (lenient)

/** Prefix the decoder gives integer map keys so that 42 and "42" stay apart (see frame.ts). */
export const INT_KEY = "\u0000int:";

function isNumber(value: unknown): value is number {
  return typeof value === "number" && Number.isFinite(value);
}

function isUid(value: unknown): value is Uid {
  return typeof value === "string" || (typeof value === "number" && Number.isInteger(value));
}

function isKey(value: unknown): value is SessionKey {
  return isUid(value) || (Array.isArray(value) && value.length === 2 && isUid(value[0]) && typeof value[1] === "string");
}

function uidOf(key: string): Uid {
  return key.startsWith(INT_KEY) ? Number(key.slice(INT_KEY.length)) : key;
}

function uidMap<T>(value: unknown, field: string, check: (v: unknown) => v is T): Map<Uid, T> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw bad(`status.${field} is not a map`);
  const map = new Map<Uid, T>();
  for (const [key, item] of Object.entries(value)) {
    if (!check(item)) throw bad(`status.${field}[${JSON.stringify(key)}] has the wrong type`);
    map.set(uidOf(key), item);
  }
  return map;
}

const isBool = (v: unknown): v is boolean => typeof v === "boolean";
const isSeen = (v: unknown): v is number | null => v === null || isNumber(v);
const isDevices = (v: unknown): v is string[] => Array.isArray(v) && v.every((d) => typeof d === "string");

function need<T>(map: Record<string, unknown>, field: string, check: (v: unknown) => v is T): T {
  const value = map[field];
  if (!check(value)) throw bad(`${String(map.op)}.${field} is missing or has the wrong type`);
  return value;
}

/** A decoded msgpack value as a server message; `bad_message` IdledError if it is not one. */
export function parseServerMessage(value: unknown): ServerMessage {
  if (typeof value !== "object" || value === null || Array.isArray(value) || value instanceof Uint8Array) {
    throw bad("a message is a map");
  }
  const map = value as Record<string, unknown>;
  switch (map.op) {
    case "welcome":
      if (map.timeout !== undefined && map.timeout !== null && !isNumber(map.timeout)) throw bad("welcome.timeout");
      if (map.max_frame !== undefined && map.max_frame !== null && !Number.isInteger(map.max_frame)) throw bad("welcome.max_frame");
      return dropNulls(map) as Welcome;
    case "pong":
      return { op: "pong" };
    case "event":
      need(map, "seq", Number.isInteger as (v: unknown) => v is number);
      if (map.kind !== "online" && map.kind !== "offline") throw bad("event.kind");
      need(map, "uid", isUid);
      need(map, "ts", isNumber);
      need(map, "reason", (v): v is string => typeof v === "string");
      need(map, "last_seen", isNumber);
      need(map, "deadline", isNumber);
      return map as unknown as PresenceEvent;
    case "status": {
      const status: Status = { op: "status", online: uidMap(map.online, "online", isBool) };
      if (map.last_seen !== undefined && map.last_seen !== null) status.last_seen = uidMap(map.last_seen, "last_seen", isSeen);
      if (map.devices !== undefined && map.devices !== null) status.devices = uidMap(map.devices, "devices", isDevices);
      return status;
    }
    case "error": {
      const error: ErrorMessage = {
        op: "error",
        code: need(map, "code", (v): v is string => typeof v === "string"),
        reason: typeof map.reason === "string" ? map.reason : "",
      };
      if (typeof map.leader === "string") error.leader = map.leader;
      return error;
    }
    case "ended": {
      const uids = need(map, "uids", (v): v is unknown[] => Array.isArray(v));
      if (!uids.every(isKey)) throw bad("ended.uids holds something that is not a session key");
      return { op: "ended", uids: uids as SessionKey[], reason: need(map, "reason", (v): v is string => typeof v === "string") };
    }
    case "mark":
      return { op: "mark", t: need(map, "t", isNumber) };
    default:
      throw bad(`unknown op ${JSON.stringify(map.op)}`);
  }
}

function dropNulls(map: Record<string, unknown>): Record<string, unknown> {
  for (const key of Object.keys(map)) if (map[key] === null) delete map[key];
  return map;
}
