// The browser build in headless Chromium against real daemons: a page's Session and watchlist Observer (over
// the browser's WebSocket) survive a daemon restart and an elected failover without a false offline -- checked
// by an independent observer over TCP -- and the build stays within its size budget.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startDaemon, until, sleep } from "./support/daemon.js";
import { Cluster, etcdBinary } from "./support/cluster.js";
import { Chromium, Site, chromiumBinary } from "./support/browser.js";
import { record } from "./support/peers.js";
import { Observer } from "../src/index.js";
import type { PresenceEvent } from "../src/index.js";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BUNDLE = join(PACKAGE, "dist", "idled.browser.js");
const FAST = { base: 0.05, cap: 0.5 };
const noChromium = chromiumBinary() === null ? "chromium not on PATH" : false;

function site(): Promise<Site> {
  return new Site({ "/idled.browser.js": BUNDLE, "/page.html": join(PACKAGE, "test", "browser", "page.html") }).start();
}

/** No offline of `uid` other than the server's own stop (`shutdown`) or a new leader's `restart`. */
function falseOfflines(events: PresenceEvent[], uid: string): PresenceEvent[] {
  return events.filter((e) => e.uid === uid && e.kind === "offline" && !["shutdown", "restart"].includes(e.reason));
}

test("the browser build is ESM, minified, within 15 KiB gzipped", () => {
  const bytes = readFileSync(BUNDLE);
  const gz = gzipSync(bytes, { level: 9 }).length;
  console.log(`dist/idled.browser.js: ${bytes.length} bytes, ${gz} bytes gzipped`);
  assert.ok(gz <= 15 * 1024, `${gz} bytes gzipped`);
  assert.match(bytes.toString(), /export\{/);
  assert.doesNotMatch(bytes.toString(), /node:(net|tls)/);
});

test("a page's session survives a daemon restart without a false offline", { skip: noChromium }, async () => {
  const pages = await site();
  const idled = await startDaemon({ args: ["--ws-origins", pages.origin] });
  const chromium = new Chromium();
  const watcher = new Observer({ host: idled.address, name: "independent", uids: ["page-user"], backoff: FAST });
  const seen = record(watcher);
  try {
    watcher.start();
    await watcher.watch([]);
    chromium.open(`${pages.origin}/page.html?hosts=${idled.address}&uid=page-user&keepalive=1`);
    await until(() => pages.of("online").length === 1, "the page online", 30);
    assert.equal(pages.of("online")[0]!.timeout, 1.5);
    await sleep(2500); // past the timeout: the page's pings keep it online
    assert.deepEqual(await watcher.query(["page-user"]), new Map([["page-user", true]]));
    await idled.restart();
    await until(() => pages.of("online").length === 2, "the page back online", 30);
    await until(() => seen.filter((e) => e.kind === "online").length === 2, "the observer saw it back", 30);
    await sleep(2000); // a timeout and more on the new run: still online, no idle offline
    assert.deepEqual(await watcher.query(["page-user"]), new Map([["page-user", true]]));
    assert.deepEqual(falseOfflines(seen, "page-user"), []);
    assert.deepEqual(seen.map((e) => [e.kind, e.reason]), [["online", "login"], ["offline", "shutdown"], ["online", "login"]]);
    // The page's own observer (browser build, WebSocket) saw the same stream, resumed without gap.
    const pageEvents = pages.of("event").map((r) => [r.seq, r.presence, r.reason]);
    assert.deepEqual(pageEvents, seen.map((e) => [e.seq, e.kind, e.reason]));
    assert.deepEqual(pages.of("closed"), []);
    assert.deepEqual(pages.of("page-error"), []);
  } finally {
    await chromium.close();
    await watcher.close(0);
    await idled.close();
    await pages.close();
  }
});

test("a page's session follows an elected failover without a false offline", { skip: noChromium || (etcdBinary() === null ? "etcd not on PATH" : false) }, async () => {
  const pages = await site();
  const cluster = await new Cluster().start(2, ["--ws-origins", pages.origin, "--timeout", "1"]);
  const chromium = new Chromium();
  let watcher: Observer | null = null;
  try {
    const leader = await cluster.settled();
    const hosts = [cluster.addresses[1 - leader]!, cluster.addresses[leader]!];
    watcher = new Observer({ host: hosts, name: "independent", uids: ["page-user"], backoff: FAST });
    const seen = record(watcher);
    watcher.start();
    await watcher.watch([]);
    chromium.open(`${pages.origin}/page.html?hosts=${hosts.join(",")}&uid=page-user&keepalive=1`);
    await until(() => pages.of("online").length === 1, "the page online at the leader", 30);
    assert.equal(pages.of("online")[0]!.address, cluster.addresses[leader]);
    await until(() => seen.some((e) => e.kind === "online"), "the observer saw it online", 20);
    await cluster.kill(leader);
    await until(() => pages.of("online").length === 2, "the page online at the new leader", 30);
    assert.equal(pages.of("online")[1]!.address, cluster.addresses[1 - leader]);
    await until(() => seen.filter((e) => e.kind === "online").length >= 2, "the observer saw it back", 30);
    await sleep(2000);
    assert.deepEqual(await watcher.query(["page-user"]), new Map([["page-user", true]]));
    assert.deepEqual(falseOfflines(seen, "page-user"), []);
    assert.deepEqual(pages.of("closed"), []);
  } finally {
    await chromium.close();
    await watcher?.close(0);
    await cluster.close();
    await pages.close();
  }
});
