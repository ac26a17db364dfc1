/** The Node entry: the protocol, both transports (TCP/TLS and WebSocket), sessions and observers. */
export * from "./protocol/index.js";
export { nodeConnector } from "./transport/node.js";
export type { NodeTransportOptions } from "./transport/node.js";
export { webSocketConnector, SUBPROTOCOL } from "./transport/browser.js";
export type { WebSocketTransportOptions } from "./transport/browser.js";
export { BaseTransport } from "./transport/transport.js";
export type { Transport, Connector } from "./transport/transport.js";
export { splitHostPort, formatAddress, parseAddresses } from "./core/address.js";
export type { HostPort } from "./core/address.js";
export { Gateway, openGateway, type GatewayOptions, type GatewayEvents, type EndedCallback } from "./gateway.js";
