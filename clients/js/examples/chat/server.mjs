/**
 * A WebSocket chat server (the `ws` package) that reports its users to idled as ONE gateway.
 *
 * Every socket is one session of its user: the key `[user, device]` (`ws://host:port/?user=alice&device=phone`;
 * a random device when none is given), attached when the socket opens, touched on every message and on every
 * pong of the server's own WebSocket ping (a silent but connected user stays online; a dead socket stops
 * answering and idles out), detached `closed` when it closes. idled says who is online -- a user is online
 * while any of its devices is -- to whoever observes it; the chat server keeps no presence of its own.
 * When idled ends a session itself (`kicked`: the same user and device logged in elsewhere; `idle`), the
 * gateway hands back the very key array this server attached, so the socket is found by identity and closed.
 *
 *   IDLED=127.0.0.1:7878 PORT=8080 node server.mjs
 */

import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { pathToFileURL } from "node:url";
import { WebSocketServer } from "ws";
import { openGateway } from "idled-client";

/** Start the chat server; resolves once it listens. `keepalive`: seconds (the sessions' timeout is 1.5x). */
export async function startChat({ port = 8080, host = "127.0.0.1", idled = "127.0.0.1:7878", name = "chat",
                                  token, keepalive = 30 } = {}) {
  const sockets = new Map(); // session key (the array itself) -> its socket
  const gateway = openGateway({
    host: idled, name, token,
    onEnded: (keys, reason) => { for (const key of keys) sockets.get(key)?.close(4000, `idled: ${reason}`); },
  });
  const wss = new WebSocketServer({ host, port });

  wss.on("connection", (ws, request) => {
    const url = new URL(request.url ?? "/", "http://chat");
    const user = url.searchParams.get("user");
    const key = [user ?? "", url.searchParams.get("device") ?? randomUUID().slice(0, 8)];
    try {
      gateway.attach([key], keepalive); // throws (bad_message) for a user or device idled would refuse
    } catch (error) {
      ws.close(4001, String(error.message).slice(0, 120));
      return;
    }
    sockets.set(key, ws);
    ws.on("message", (data) => {
      gateway.touch([key]);
      const line = JSON.stringify({ from: user, text: String(data) });
      for (const other of wss.clients) if (other.readyState === 1) other.send(line);
    });
    ws.on("pong", () => gateway.touch([key]));
    ws.on("close", () => {
      if (sockets.get(key) === ws) sockets.delete(key);
      gateway.detach([key], "closed");
    });
  });
  const heartbeat = setInterval(() => { for (const ws of wss.clients) ws.ping(); }, (keepalive * 1000) / 2);

  await once(wss, "listening");
  return {
    port: wss.address().port,
    gateway,
    /** Stop: close every socket, then log the gateway out (idled ends its sessions: `gateway_lost`). */
    async close() {
      clearInterval(heartbeat);
      for (const ws of wss.clients) ws.terminate();
      await new Promise((resolve) => wss.close(resolve));
      await gateway.close();
    },
  };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const chat = await startChat({ port: Number(process.env.PORT ?? 8080), idled: process.env.IDLED ?? "127.0.0.1:7878",
                                 token: process.env.IDLED_TOKEN });
  console.log(`chat on ws://127.0.0.1:${chat.port}/?user=NAME, reporting to idled as gateway "chat"`);
  process.on("SIGINT", () => chat.close().then(() => process.exit(0)));
}
