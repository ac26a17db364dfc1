/**
 * An observer's position and watchlist (sans-IO; idled/client/core.py's ObserverCursor).
 *
 * `last` is the last seq handed to the application (or its stored checkpoint at start); `subscribeMessages()`
 * asks for `from = last + 1`, durable-only when `durable` (by default exactly when the application gave a
 * checkpoint: it keeps state that must agree with the log after any crash); `accept(event)` drops any event
 * whose seq is not beyond `last`, so a replay overlap never reaches the application twice within one process.
 * Across a restart of the application delivery is at-least-once: events after its stored checkpoint come again.
 *
 * A watchlist observer's cursor also holds its current watchlist (`uids`, insertion-ordered): every
 * (re)connection sends it again as `watch` messages of at most a frame each, then the `subscribe` carrying the
 * last part -- all before the subscribe's replay starts, so a resume `from` a seq replays every uid's events
 * (a list sent after it would miss those of the uids it carried).
 */

import { DEFAULT_MAX_FRAME } from "../protocol/messages.js";
import type { ClientMessage, PresenceEvent, Subscribe, Uid } from "../protocol/messages.js";

const FRAME_OVERHEAD = 64; // op, keys, array header: generous, so a frame never exceeds the limit
const encoder = new TextEncoder();

/** An upper bound of a uid's msgpack size. */
export function uidSize(uid: Uid): number {
  return typeof uid === "number" ? 9 : encoder.encode(uid).length + 3;
}

/** `uids` in runs that each fit one frame of at most `maxFrame` body bytes with its other fields. */
export function uidChunks(uids: Iterable<Uid>, maxFrame: number = DEFAULT_MAX_FRAME): Uid[][] {
  const budget = maxFrame - FRAME_OVERHEAD;
  if (budget < 256 + 3) throw new RangeError(`maxFrame ${maxFrame} is too small for a frame of uids`);
  const chunks: Uid[][] = [];
  let chunk: Uid[] = [];
  let size = 0;
  for (const uid of uids) {
    const n = uidSize(uid);
    if (size + n > budget) {
      chunks.push(chunk);
      chunk = [];
      size = 0;
    }
    chunk.push(uid);
    size += n;
  }
  if (chunk.length > 0) chunks.push(chunk);
  return chunks;
}

export class ObserverCursor {
  last: number | null;
  readonly durable: boolean;
  /** The watchlist (null: every event). A Set keeps insertion order. */
  readonly uids: Set<Uid> | null;

  constructor(after: number | null = null, durable: boolean | null = null, uids: Iterable<Uid> | null = null) {
    if (after !== null && !(Number.isSafeInteger(after) && after >= 0)) {
      throw new RangeError("after must be a seq (>= 0; 0 = from the first event ever)");
    }
    this.last = after;
    this.durable = durable ?? after !== null;
    this.uids = uids === null ? null : new Set(uids);
  }

  /** The subscribe of a (re)connection: from last + 1, or from now if nothing was seen yet. */
  subscribe(): Subscribe {
    const message: Subscribe = { op: "subscribe" };
    if (this.last !== null) message.from = this.last + 1;
    if (this.durable) message.durable = true;
    if (this.uids !== null) message.uids = [...this.uids];
    return message;
  }

  /** `subscribe()` as messages of at most `maxFrame` body bytes: the watchlist's first parts as `watch`
   * messages, then the subscribe with the last part. */
  subscribeMessages(maxFrame: number = DEFAULT_MAX_FRAME): ClientMessage[] {
    const subscribe = this.subscribe();
    if (!subscribe.uids || subscribe.uids.length === 0) return [subscribe];
    const chunks = uidChunks(subscribe.uids, maxFrame);
    const last = chunks.pop()!;
    return [...chunks.map((uids): ClientMessage => ({ op: "watch", uids })), { ...subscribe, uids: last }];
  }

  private watchlist(): Set<Uid> {
    if (this.uids === null) {
      throw new TypeError("not a watchlist observer: give it uids (an empty list is one) to watch uids");
    }
    return this.uids;
  }

  /** Add `uids` to the watchlist; the `watch` messages that tell the server. */
  watch(uids: Iterable<Uid>): ClientMessage[] {
    const list = this.watchlist();
    const added = [...new Set(uids)];
    for (const uid of added) list.add(uid);
    return uidChunks(added).map((chunk): ClientMessage => ({ op: "watch", uids: chunk }));
  }

  /** Remove `uids` from the watchlist; the `unwatch` messages that tell the server. */
  unwatch(uids: Iterable<Uid>): ClientMessage[] {
    const list = this.watchlist();
    const removed = [...new Set(uids)];
    for (const uid of removed) list.delete(uid);
    return uidChunks(removed).map((chunk): ClientMessage => ({ op: "unwatch", uids: chunk }));
  }

  /** True if `event` is new (and advance); false for a duplicate of something already delivered. */
  accept(event: PresenceEvent): boolean {
    if (this.last !== null && event.seq <= this.last) return false;
    this.last = event.seq;
    return true;
  }
}
