/**
 * Sessions and observers for browsers: WebSocket (`wss://` on an https page, else `ws://`, or as `secure`
 * says), subprotocol `idled.v1`. Hosts are "host:port" as everywhere (a list and `not_leader` hints work).
 */

import { Session as CoreSession } from "../session.js";
import type { SessionOptions as CoreSessionOptions } from "../session.js";
import { Observer as CoreObserver } from "../observer.js";
import type { ObserverOptions as CoreObserverOptions } from "../observer.js";
import { webSocketConnector } from "../transport/browser.js";
import type { Connector } from "../transport/transport.js";

export interface BrowserConnectOptions {
  /** wss:// (true) or ws:// (false); default: the page's own scheme. */
  secure?: boolean;
  /** The WebSocket request path (default "/"). */
  path?: string;
}

function connectorFor(options: BrowserConnectOptions & { connectTimeout?: number }): Connector {
  return webSocketConnector({
    ...(options.secure !== undefined ? { secure: options.secure } : {}),
    ...(options.path !== undefined ? { path: options.path } : {}),
    ...(options.connectTimeout !== undefined ? { connectTimeout: options.connectTimeout } : {}),
  });
}

export type SessionOptions = CoreSessionOptions & BrowserConnectOptions;
export type ObserverOptions = CoreObserverOptions & BrowserConnectOptions;

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
