/**
 * Addresses of cores: "HOST:PORT", "[IPv6]:PORT", or a bare "HOST" / "[IPv6]" taking the default port; a list is
 * comma-separated or an array of such strings (the grammar of idled/protocol/address.py). Members are compared
 * in their normal form ("host:port", IPv6 in brackets), so a `leader` hint matches the member it names.
 */

export interface HostPort { host: string; port: number }

/** One address as host and port (throws a RangeError naming the text when it is not one). */
export function splitHostPort(text: string, defaultPort: number): HostPort {
  const given = text;
  text = text.trim();
  let host: string;
  let portText: string | undefined;
  if (text.startsWith("[")) {
    const end = text.indexOf("]");
    if (end < 0) throw new RangeError(`bad address ${JSON.stringify(given)}: no closing bracket`);
    host = text.slice(1, end);
    const rest = text.slice(end + 1);
    if (rest !== "" && !rest.startsWith(":")) throw new RangeError(`bad address ${JSON.stringify(given)}`);
    portText = rest === "" ? undefined : rest.slice(1);
  } else if ((text.match(/:/g) ?? []).length > 1) {
    host = text; // a bare IPv6 address
  } else {
    const colon = text.indexOf(":");
    host = colon < 0 ? text : text.slice(0, colon);
    portText = colon < 0 ? undefined : text.slice(colon + 1);
  }
  if (host === "") throw new RangeError(`bad address ${JSON.stringify(given)}: no host`);
  if (portText === undefined) return { host, port: defaultPort };
  const port = Number(portText);
  if (!/^\d+$/.test(portText) || port < 1 || port > 65535) {
    throw new RangeError(`bad address ${JSON.stringify(given)}: the port must be 1..65535`);
  }
  return { host, port };
}

/** "host:port" with an IPv6 host in brackets. */
export function formatAddress({ host, port }: HostPort): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

/** The normal form of each address of a list, in order, duplicates dropped. */
export function parseAddresses(hosts: string | readonly string[], defaultPort: number): string[] {
  const items = typeof hosts === "string" ? hosts.split(",") : [...hosts];
  if (items.length === 0) throw new RangeError("at least one core address is needed");
  return [...new Set(items.map((item) => formatAddress(splitHostPort(item, defaultPort))))];
}
