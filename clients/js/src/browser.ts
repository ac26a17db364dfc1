/** The browser entry: the protocol, the WebSocket transport (and, as they land, sessions and observers). */
export * from "./protocol/index.js";
export { webSocketConnector, SUBPROTOCOL } from "./transport/browser.js";
export type { WebSocketTransportOptions } from "./transport/browser.js";
export type { Transport, Connector } from "./transport/transport.js";
