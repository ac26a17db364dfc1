// TLS from Node against `idled serve --tls-cert/--tls-key` (a private CA made with the openssl binary, as
// tests/tlscerts.py does): `tls: {ca}` verifies the server and logs in; a reconnect resumes the TLS session;
// plain TCP to the TLS port is `tls_required`, final; a server the CA did not sign is refused.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { Daemon, startDaemon } from "./support/daemon.js";
import { nodeConnector } from "../src/transport/node.js";
import { encodeBody } from "../src/protocol/frame.js";
import { Session } from "../src/index.js";
import type { IdledError } from "../src/index.js";

function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
const skip = hasOpenssl() ? false : "the openssl binary is not installed (Debian: openssl)";
const dir = mkdtempSync(join(tmpdir(), "idled-js-tls-"));
const openssl = (...args: string[]): void => { execFileSync("openssl", args, { stdio: "ignore", timeout: 60_000 }); };
const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];

function certificate(name: string, ca: string, caKey: string): { cert: string; key: string } {
  const cert = join(dir, `${name}.pem`), key = join(dir, `${name}.key`), csr = join(dir, `${name}.csr`), ext = join(dir, `${name}.ext`);
  writeFileSync(ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  openssl("req", "-new", ...EC, "-keyout", key, "-out", csr, "-subj", "/CN=localhost");
  openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", caKey, "-set_serial", String(Date.now() % 1e9), "-days", "2", "-extfile", ext, "-out", cert);
  return { cert, key };
}

function authority(name: string): { ca: string; key: string } {
  const ca = join(dir, `${name}.pem`), key = join(dir, `${name}.key`);
  openssl("req", "-x509", ...EC, "-keyout", key, "-out", ca, "-days", "2", "-subj", `/CN=${name}`);
  return { ca, key };
}

let idled: Daemon;
let ca: Buffer;
let other: Buffer;

before(async () => {
  if (skip) return;
  const main = authority("ca");
  const server = certificate("server", main.ca, main.key);
  ca = readFileSync(main.ca);
  other = readFileSync(authority("other").ca);
  idled = await startDaemon({ args: ["--tls-cert", server.cert, "--tls-key", server.key] });
});
after(async () => {
  await idled?.close();
  rmSync(dir, { recursive: true, force: true });
});

test("tls: {ca} verifies the server, logs in, and a reconnect resumes the TLS session", { skip }, async () => {
  const session = new Session({ host: idled.address, uid: "tina", keepalive: 5, tls: { ca } }).start();
  await session.waitConnected();
  assert.equal(session.timeout, 7.5);
  await session.close();
  // The connector keeps each core's last session ticket: the next connect offers it.
  const connect = nodeConnector({ tls: { ca } });
  for (const expected of [false, true]) {
    const transport = await connect(idled.address);
    const welcome = new Promise((resolve) => { transport.onMessage = resolve; });
    transport.send(encodeBody({ op: "login", uid: "tina" }));
    await welcome; // the session ticket has arrived by the time the server answers
    const socket = (transport as unknown as { socket: TLSSocket }).socket;
    assert.equal(socket.isSessionReused(), expected);
    transport.close();
  }
});

test("plain TCP to the TLS port is tls_required, final", { skip }, async () => {
  const session = new Session({ host: idled.address, uid: "tina" }).start();
  await assert.rejects(session.wait(), (e: IdledError) => e.code === "tls_required" && e.final);
});

test("a server certificate the given CA did not sign is refused", { skip }, async () => {
  const session = new Session({ host: idled.address, uid: "tina", tls: { ca: other }, reconnect: false }).start();
  await assert.rejects(session.wait(), (e: IdledError) => e.code === "connection_lost" && /certificate/i.test(e.reason));
});
