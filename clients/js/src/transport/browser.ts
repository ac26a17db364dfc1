/**
 * The WebSocket transport (browsers; also any runtime with a standard `WebSocket`): subprotocol `idled.v1`,
 * one frame body per binary message (no length prefix), binary only.
 *
 * `webSocketConnector(options)` returns a `Connector`: an address "host:port" becomes
 * `ws[s]://host:port/path`, so a list of cores and a `not_leader` hint work exactly as over TCP. `secure`
 * defaults to the page's own scheme (an https page can open only wss://). A message larger than `maxFrame`
 * or one that does not decode closes the socket with that error.
 *
 * A browser cannot send WebSocket ping frames: the session's keepalive is the protocol's `ping` message.
 */

import { connectionLost } from "../protocol/errors.js";
import type { IdledError } from "../protocol/errors.js";
import { decodeBody } from "../protocol/frame.js";
import { CLIENT_MAX_FRAME } from "../protocol/messages.js";
import { BaseTransport } from "./transport.js";
import type { Connector, Transport } from "./transport.js";

export type { Transport, Connector } from "./transport.js";

export const SUBPROTOCOL = "idled.v1";

export interface WebSocketTransportOptions {
  /** wss:// (true) or ws:// (false). Default: wss:// on an https page, else ws://. */
  secure?: boolean;
  /** The request path. Default "/". */
  path?: string;
  /** Seconds to open the WebSocket before giving up. Default 10. */
  connectTimeout?: number;
  /** Largest message accepted from the server. Default 16 MiB. */
  maxFrame?: number;
  /** The WebSocket class (default: the global one). */
  WebSocket?: typeof WebSocket;
}

class WebSocketTransport extends BaseTransport {
  readonly remote: string;

  constructor(private readonly socket: WebSocket, remote: string, maxFrame: number) {
    super();
    this.remote = remote;
    socket.onmessage = (event: MessageEvent) => {
      if (this.ended) return;
      const data = event.data;
      if (!(data instanceof ArrayBuffer)) return this.fail(connectionLost("a text message from the server"));
      if (data.byteLength > maxFrame) return this.fail(connectionLost(`a message of ${data.byteLength} bytes from the server`));
      let message;
      try {
        message = decodeBody(new Uint8Array(data));
      } catch (error) {
        const e = error as IdledError;
        return this.fail(connectionLost(`undecodable message from the server (${e.code}: ${e.reason})`));
      }
      this.onMessage(message);
    };
    socket.onclose = (event: CloseEvent) => {
      this.finish(connectionLost(`${remote}: closed (${event.code}${event.reason ? ` ${event.reason}` : ""})`));
    };
    socket.onerror = () => this.finish(connectionLost(`${remote}: WebSocket error`));
  }

  private fail(error: IdledError): void {
    this.finish(error);
    this.socket.close();
  }

  send(body: Uint8Array): boolean {
    if (this.ended || this.socket.readyState !== 1) return false;
    this.socket.send(body);
    return true;
  }

  get bufferedAmount(): number {
    return this.socket.bufferedAmount;
  }

  close(): void {
    this.finish(connectionLost(`${this.remote}: closed by the client`));
    this.socket.close(1000);
  }
}

function pageIsSecure(): boolean {
  const location = (globalThis as { location?: { protocol?: string } }).location;
  return location?.protocol === "https:";
}

/** A Connector over WebSocket (see the module comment). */
export function webSocketConnector(options: WebSocketTransportOptions = {}): Connector {
  const secure = options.secure ?? pageIsSecure();
  const path = options.path ?? "/";
  const timeout = (options.connectTimeout ?? 10) * 1000;
  const maxFrame = options.maxFrame ?? CLIENT_MAX_FRAME;
  return (address: string) =>
    new Promise<Transport>((resolve, reject) => {
      const Socket = options.WebSocket ?? globalThis.WebSocket;
      const url = `${secure ? "wss" : "ws"}://${address}${path}`;
      let socket: WebSocket;
      try {
        socket = new Socket(url, SUBPROTOCOL);
      } catch (error) {
        reject(connectionLost(`cannot open ${url}: ${(error as Error).message}`));
        return;
      }
      socket.binaryType = "arraybuffer";
      const timer = setTimeout(() => {
        socket.close();
        reject(connectionLost(`opening ${url} timed out after ${timeout / 1000} s`));
      }, timeout);
      socket.onerror = () => {
        clearTimeout(timer);
        reject(connectionLost(`connect to ${url} failed`));
      };
      socket.onclose = (event: CloseEvent) => {
        clearTimeout(timer);
        reject(connectionLost(`connect to ${url} failed (${event.code})`));
      };
      socket.onopen = () => {
        clearTimeout(timer);
        resolve(new WebSocketTransport(socket, address, maxFrame));
      };
    });
}
