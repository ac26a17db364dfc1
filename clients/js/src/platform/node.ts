/**
 * Sessions and observers for Node: TCP by default, TLS with `tls` (true, or Node's `tls.ConnectionOptions`:
 * `ca` for a private CA, `cert`/`key` for a client certificate, `servername` when the certificate names the
 * core differently from the address dialled), WebSocket with `websocket: true` (Node 22's global WebSocket).
 */

import type { ConnectionOptions } from "node:tls";
import { Session as CoreSession } from "../session.js";
import type { SessionOptions as CoreSessionOptions } from "../session.js";
import { Observer as CoreObserver } from "../observer.js";
import type { ObserverOptions as CoreObserverOptions } from "../observer.js";
import { nodeConnector } from "../transport/node.js";
import { webSocketConnector } from "../transport/browser.js";
import type { Connector } from "../transport/transport.js";

export interface NodeConnectOptions {
  /** TLS: true for Node's defaults, or its `tls.ConnectionOptions` (ca, cert, key, servername, ...). */
  tls?: boolean | ConnectionOptions;
  /** Speak WebSocket instead of framed TCP (needs a global WebSocket: Node 22, or pass `connector`). */
  websocket?: boolean;
  /** Largest frame accepted from the server (default 16 MiB). */
  maxFrame?: number;
}

export function connectorFor(options: NodeConnectOptions & { connectTimeout?: number }): Connector {
  const common = {
    ...(options.connectTimeout !== undefined ? { connectTimeout: options.connectTimeout } : {}),
    ...(options.maxFrame !== undefined ? { maxFrame: options.maxFrame } : {}),
  };
  if (options.websocket) return webSocketConnector({ ...common, secure: Boolean(options.tls) });
  return nodeConnector({ ...common, ...(options.tls !== undefined ? { tls: options.tls } : {}) });
}

export type SessionOptions = CoreSessionOptions & NodeConnectOptions;
export type ObserverOptions = CoreObserverOptions & NodeConnectOptions;

export class Session extends CoreSession {
  constructor(options: SessionOptions) {
    super(options, connectorFor(options));
  }
}

export class Observer extends CoreObserver {
  constructor(options: ObserverOptions) {
    super(options, connectorFor(options));
  }
}
