/**
 * Framing, sans-IO: a frame is a 4-byte big-endian length N, then N bytes of msgpack holding ONE map.
 *
 * Theory of operation
 * -------------------
 * `encodeBody(msg)` is the msgpack body (what a WebSocket message carries); `encodeFrame(msg)` puts the length
 * prefix before it (what TCP carries). `FrameDecoder.push(chunk)` buffers received bytes and returns every
 * message completed by them, in order; a frame may be split anywhere and several may arrive in one chunk. The
 * limit (`maxFrame`) is checked as soon as the 4 prefix bytes are in, before any of the body is buffered, so a
 * hostile length never makes the decoder allocate. N = 0, a body that is not exactly one msgpack value (trailing
 * bytes, truncated), an ext type, a non-map or an invalid message throws an `IdledError` (`bad_frame`,
 * `too_large`, `bad_message`); after one error the decoder stays failed (the connection must be closed, as the
 * protocol says: nothing after a bad frame can be trusted).
 *
 * By hand, `push([0,0,0])` returns [] (a partial prefix), `push([9, 0x81, ...])` the first byte completes the
 * prefix (N = 9 <= maxFrame), the body is buffered until 9 bytes are in, then decoded: [{op: "ping"}].
 *
 * Integer map keys (a `status` reply keyed by int uids) are turned into strings marked with `INT_KEY`, so that
 * the uid 42 and the uid "42" stay two keys; `parseServerMessage` turns them back into numbers.
 */

import { Decoder, Encoder, ExtensionCodec } from "@msgpack/msgpack";
import { IdledError, ErrorCode } from "./errors.js";
import { CLIENT_MAX_FRAME, INT_KEY, parseServerMessage } from "./messages.js";
import type { ClientMessage, ServerMessage } from "./messages.js";

// No ext type is valid anywhere in the protocol; refuse them rather than decode a timestamp into a Date.
const noExtensions = new ExtensionCodec();
const msgpackEncoder = new Encoder({ ignoreUndefined: true, extensionCodec: noExtensions });

function mapKey(key: unknown): string | number {
  if (typeof key === "string") return key;
  if (typeof key === "number" && Number.isInteger(key)) return INT_KEY + String(key);
  throw new IdledError(ErrorCode.BAD_FRAME, `a map key is a string or an integer, got ${typeof key}`);
}

const msgpackDecoder = new Decoder({ extensionCodec: noExtensions, mapKeyConverter: mapKey });

/** The msgpack body of a message (no prefix): a WebSocket message, or what `encodeFrame` prefixes. */
export function encodeBody(message: ClientMessage): Uint8Array {
  return msgpackEncoder.encode(message);
}

/** A length prefix and the body, in one buffer. */
export function frameOf(body: Uint8Array): Uint8Array {
  const frame = new Uint8Array(4 + body.length);
  new DataView(frame.buffer).setUint32(0, body.length);
  frame.set(body, 4);
  return frame;
}

/** The message as a TCP frame: 4-byte big-endian length, then the msgpack map. */
export function encodeFrame(message: ClientMessage): Uint8Array {
  return frameOf(encodeBody(message));
}

/** One body (a frame without its prefix, or a WebSocket message) as a server message. */
export function decodeBody(body: Uint8Array): ServerMessage {
  if (body.length === 0) throw new IdledError(ErrorCode.BAD_FRAME, "empty frame");
  let value: unknown;
  try {
    value = msgpackDecoder.decode(body);
  } catch (error) {
    if (error instanceof IdledError) throw error;
    throw new IdledError(ErrorCode.BAD_FRAME, `not one msgpack value: ${(error as Error).message}`);
  }
  if (typeof value === "object" && value !== null && value.constructor?.name === "ExtData") {
    throw new IdledError(ErrorCode.BAD_FRAME, "msgpack ext types are not allowed");
  }
  return parseServerMessage(value);
}

export class FrameDecoder {
  readonly maxFrame: number;
  private buffer: Uint8Array = new Uint8Array(0);
  private failed: IdledError | null = null;

  constructor(maxFrame: number = CLIENT_MAX_FRAME) {
    if (!(Number.isInteger(maxFrame) && maxFrame >= 1 && maxFrame <= 0xffffffff)) {
      throw new RangeError(`maxFrame must be an integer in 1..2^32-1, got ${maxFrame}`);
    }
    this.maxFrame = maxFrame;
  }

  /** Bytes buffered, waiting for the rest of their frame. */
  get buffered(): number {
    return this.buffer.length;
  }

  /** The error that failed this decoder (set once bad input was seen), else null. */
  get failure(): IdledError | null {
    return this.failed;
  }

  /** Every message completed by `chunk`, in order; throws an IdledError on bad input (and ever after). When
   * good frames came before the bad one in the same chunk they are returned, `failure` is set, and the next
   * push throws: a reader delivers them, then checks `failure`. */
  push(chunk: Uint8Array): ServerMessage[] {
    if (this.failed) throw this.failed;
    let data = chunk;
    if (this.buffer.length > 0) {
      data = new Uint8Array(this.buffer.length + chunk.length);
      data.set(this.buffer);
      data.set(chunk, this.buffer.length);
    }
    const messages: ServerMessage[] = [];
    const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    let at = 0;
    try {
      while (data.length - at >= 4) {
        const n = view.getUint32(at);
        if (n === 0) throw new IdledError(ErrorCode.BAD_FRAME, "frame length 0");
        if (n > this.maxFrame) {
          throw new IdledError(ErrorCode.TOO_LARGE, `frame of ${n} bytes exceeds the limit of ${this.maxFrame}`);
        }
        if (data.length - at - 4 < n) break;
        messages.push(decodeBody(data.subarray(at + 4, at + 4 + n)));
        at += 4 + n;
      }
    } catch (error) {
      this.failed = error instanceof IdledError ? error : new IdledError(ErrorCode.BAD_FRAME, String(error));
      this.buffer = new Uint8Array(0);
      if (messages.length === 0) throw this.failed;
      return messages; // the good frames before the bad one; `failure` says the rest, the next push throws it

    }
    // Keep only the unfinished frame; copy it so the caller's chunk is not held alive.
    this.buffer = at === data.length ? new Uint8Array(0) : data.slice(at);
    return messages;
  }
}
