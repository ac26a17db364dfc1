/**
 * TCP and TLS transports for Node (`node:net`, `node:tls`): frames with a 4-byte length prefix.
 *
 * `nodeConnector(options)` returns a `Connector`: each call opens one connection to "host:port" (IPv6 in
 * brackets), within `connectTimeout` seconds, and resolves once it is connected (for TLS: once the handshake
 * verified the server). Received bytes go through one `FrameDecoder` per connection (limit `maxFrame`); a
 * decoding error closes the connection with that error. Writes go straight to the socket (Node queues them);
 * `bufferedAmount` is the socket's `writableLength`, for callers that must not outrun the network.
 *
 * TLS (`tls: true` or Node's `tls.ConnectionOptions`): the server is verified against `ca` (default: Node's
 * bundled roots) as `servername` (default: the host connected to, unless it is an IP address, which Node
 * checks against the certificate's IP SANs); `cert`/`key` give a client certificate (a gateway or observer that
 * logs in by certificate). The connector remembers each address's last TLS session and offers it on the next
 * connect, so a reconnect costs a resumed handshake, not a full one (what makes a reconnect storm affordable
 * for the server, as in the Python client).
 */

import * as net from "node:net";
import * as tls from "node:tls";
import { connectionLost, IdledError } from "../protocol/errors.js";
import { FrameDecoder, frameOf } from "../protocol/frame.js";
import { CLIENT_MAX_FRAME, DEFAULT_PORT } from "../protocol/messages.js";
import { BaseTransport } from "./transport.js";
import type { Connector, Transport } from "./transport.js";
import { splitHostPort } from "../core/address.js";

export type { Transport, Connector } from "./transport.js";

export interface NodeTransportOptions {
  /** TLS: `true` for the defaults, or Node's options (ca, cert, key, servername, rejectUnauthorized, ...). */
  tls?: boolean | tls.ConnectionOptions;
  /** Seconds to connect (and finish the TLS handshake) before giving up. Default 10. */
  connectTimeout?: number;
  /** Largest frame accepted from the server. Default 16 MiB. */
  maxFrame?: number;
  /** Disable Nagle's algorithm (default true: a ping is one small write that should go at once). */
  noDelay?: boolean;
}

class NodeTransport extends BaseTransport {
  readonly remote: string;
  private readonly decoder: FrameDecoder;

  constructor(private readonly socket: net.Socket, remote: string, maxFrame: number) {
    super();
    this.remote = remote;
    this.decoder = new FrameDecoder(maxFrame);
    socket.on("data", (chunk: Buffer) => this.received(chunk));
    socket.on("error", (error: Error) => this.finish(connectionLost(`${remote}: ${error.message}`)));
    socket.on("close", () => this.finish(connectionLost(`${remote}: the server closed the connection`)));
  }

  private received(chunk: Buffer): void {
    if (this.ended) return;
    let messages;
    try {
      messages = this.decoder.push(chunk);
    } catch (error) {
      this.fail(error as IdledError);
      return;
    }
    for (const message of messages) {
      if (this.ended) return;
      this.onMessage(message);
    }
    const failure = this.decoder.failure;
    if (failure !== null) this.fail(failure);
  }

  private fail(error: IdledError): void {
    // Retryable on purpose, as in the Python client: a server cutting a slow observer can leave a frame
    // half-written before its `busy`; a fresh connection resumes by seq.
    this.finish(connectionLost(`undecodable frame from the server (${error.code}: ${error.reason})`));
    this.socket.destroy();
  }

  send(body: Uint8Array): boolean {
    if (this.ended || this.socket.destroyed) return false;
    this.socket.write(frameOf(body));
    return true;
  }

  get bufferedAmount(): number {
    return this.socket.writableLength;
  }

  close(): void {
    this.finish(connectionLost(`${this.remote}: closed by the client`));
    this.socket.destroy();
  }
}

/** A Connector over TCP or TLS (see the module comment). */
export function nodeConnector(options: NodeTransportOptions = {}): Connector {
  const sessions = new Map<string, Buffer>(); // address -> its last TLS session, offered on the next connect
  const timeout = (options.connectTimeout ?? 10) * 1000;
  const maxFrame = options.maxFrame ?? CLIENT_MAX_FRAME;
  return (address: string) =>
    new Promise<Transport>((resolve, reject) => {
      const { host, port } = splitHostPort(address, DEFAULT_PORT);
      let socket: net.Socket;
      const ready = options.tls ? "secureConnect" : "connect";
      if (options.tls) {
        const given: tls.ConnectionOptions = options.tls === true ? {} : options.tls;
        const servername = given.servername ?? (net.isIP(host) ? undefined : host);
        const session = sessions.get(address);
        socket = tls.connect({ ...given, host, port, ...(servername ? { servername } : {}), ...(session ? { session } : {}) });
        socket.on("session", (data: Buffer) => sessions.set(address, data));
      } else {
        socket = net.connect({ host, port });
      }
      socket.setNoDelay(options.noDelay ?? true);
      const timer = setTimeout(() => {
        socket.destroy();
        reject(connectionLost(`connect to ${address} timed out after ${timeout / 1000} s`));
      }, timeout);
      const failed = (error: NodeJS.ErrnoException): void => {
        clearTimeout(timer);
        socket.destroy();
        reject(connectionLost(`connect to ${address} failed: ${error.message}`, error.code === "ECONNREFUSED"));
      };
      socket.once("error", failed);
      socket.once(ready, () => {
        clearTimeout(timer);
        socket.off("error", failed);
        resolve(new NodeTransport(socket, address, maxFrame));
      });
    });
}

export { IdledError };
