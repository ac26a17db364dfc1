/**
 * What every role (session, observer, gateway) needs from a connection, whatever carries it: a TCP or TLS
 * socket with length-prefixed frames (transport/node.ts) or a WebSocket with one frame body per binary
 * message (transport/browser.ts).
 *
 * `send(body)` takes a msgpack body (`encodeBody`): the transport frames it. Messages that arrive before the
 * owner sets `onMessage` are held and handed over when it does, so nothing is lost between the connect and
 * the first handler. `onClose` is called exactly once, with why the connection ended (an `IdledError`,
 * `connection_lost` unless a decoding error says otherwise); an `error` frame from the server is a message like
 * any other (the owner turns it into its error, then closes).
 */

import type { IdledError } from "../protocol/errors.js";
import type { ServerMessage } from "../protocol/messages.js";

export interface Transport {
  /** Queue one body for sending; false when the transport is closed (nothing was sent). */
  send(body: Uint8Array): boolean;
  /** Close now (idempotent); `onClose` follows. */
  close(): void;
  /** Bytes accepted by `send` and not yet handed to the network (back-pressure). */
  readonly bufferedAmount: number;
  /** Where this transport is connected ("host:port" or the URL). */
  readonly remote: string;
  onMessage: (message: ServerMessage) => void;
  onClose: (error: IdledError) => void;
}

/** A connect function: one attempt at one address ("host:port"); rejects with a `connection_lost` IdledError. */
export type Connector = (address: string) => Promise<Transport>;

/** The shared part of both transports: held messages until a handler is set, and a once-only close. */
export abstract class BaseTransport implements Transport {
  abstract send(body: Uint8Array): boolean;
  abstract close(): void;
  abstract get bufferedAmount(): number;
  abstract readonly remote: string;

  private held: ServerMessage[] | null = [];
  private heldClose: IdledError | null = null;
  private messageHandler: (message: ServerMessage) => void = (message) => this.held?.push(message);
  private closeHandler: ((error: IdledError) => void) | null = null;
  protected ended = false;

  get onMessage(): (message: ServerMessage) => void {
    return this.messageHandler;
  }

  set onMessage(handler: (message: ServerMessage) => void) {
    this.messageHandler = handler;
    const held = this.held;
    this.held = null;
    for (const message of held ?? []) handler(message);
    this.deliverHeldClose();
  }

  get onClose(): (error: IdledError) => void {
    return (error) => this.closeHandler?.(error);
  }

  set onClose(handler: (error: IdledError) => void) {
    this.closeHandler = handler;
    this.deliverHeldClose();
  }

  /** An end that came before both handlers were set: delivered once they are (messages first). */
  private deliverHeldClose(): void {
    if (this.heldClose !== null && this.held === null && this.closeHandler !== null) {
      const error = this.heldClose;
      this.heldClose = null;
      this.closeHandler(error);
    }
  }

  /** Deliver the end once; held until both handlers are set (messages first). */
  protected finish(error: IdledError): void {
    if (this.ended) return;
    this.ended = true;
    if (this.closeHandler !== null && this.held === null) this.closeHandler(error);
    else this.heldClose = error;
  }
}
