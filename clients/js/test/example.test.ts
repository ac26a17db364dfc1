// examples/browser/ in headless Chromium against a real daemon, unchanged, inside a same-origin harness page
// that reports what it shows: its own session online with the server's timeout, and its watchlist -- a user a
// gateway attached online, a user never seen offline, then one going offline as it happens.
import { test } from "node:test";
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startDaemon, until } from "./support/daemon.js";
import { Chromium, Site, chromiumBinary } from "./support/browser.js";
import type { Report } from "./support/browser.js";
import { RawGateway } from "./support/peers.js";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

test("examples/browser shows the user's own presence and a watchlist", { skip: chromiumBinary() === null ? "chromium not on PATH" : false }, async () => {
  const pages = await new Site({
    "/dist/idled.browser.js": join(PACKAGE, "dist", "idled.browser.js"),
    "/examples/browser/index.html": join(PACKAGE, "examples", "browser", "index.html"),
    "/harness.html": join(PACKAGE, "test", "browser", "harness.html"),
  }).start();
  const idled = await startDaemon({ args: ["--ws-origins", pages.origin] });
  const gateway = await RawGateway.login(idled.address, "edge");
  const chromium = new Chromium();
  const latest = (): Report | undefined => pages.of("snapshot").at(-1);
  const rows = (): string => JSON.stringify(latest()?.rows ?? []);
  try {
    gateway.attach(["bob"]);
    await gateway.sync();
    const page = `/examples/browser/index.html?hosts=${idled.address}&uid=alice&keepalive=20&watch=bob,carol&connect=1`;
    chromium.open(`${pages.origin}/harness.html?src=${encodeURIComponent(page)}`);
    await until(() => rows() === JSON.stringify([["bob", "online "], ["carol", "offline (never seen)"]]), `the watchlist (${rows()})`, 30);
    assert.equal(latest()!.state, "online as alice (offline after 30 s of silence)");
    assert.equal(latest()!.stateClass, "online");
    gateway.detach(["bob"]);
    await until(() => /^offline \(detach, last seen /.test((latest()?.rows as string[][] | undefined)?.[0]?.[1] ?? ""), `bob offline (${rows()})`, 20);
  } finally {
    await chromium.close();
    gateway.close();
    await idled.close();
    await pages.close();
  }
});
