/** The browser entry: the protocol, the WebSocket transport, sessions and observers. */
export * from "./protocol/index.js";
export { webSocketConnector, SUBPROTOCOL } from "./transport/browser.js";
export type { WebSocketTransportOptions } from "./transport/browser.js";
export type { Transport, Connector } from "./transport/transport.js";
export { Backoff } from "./core/keepalive.js";
export type { BackoffOptions } from "./core/keepalive.js";
export type { Clock } from "./core/clock.js";
export type { LinkOptions, LinkEvents } from "./link.js";
export type { SessionEvents } from "./session.js";
export type { ObserverEvents, UserStatus } from "./observer.js";
export { Session, Observer } from "./platform/browser.js";
export type { SessionOptions, ObserverOptions, BrowserConnectOptions } from "./platform/browser.js";
