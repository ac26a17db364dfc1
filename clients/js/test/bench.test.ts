// The gateway benchmark at a small size (300 sessions per gateway, keepalive 1 s, ~20 s): it runs end to end
// -- daemon, independent observer, the Node and the Python gateway, the checker -- and both gateways pass.
// The 100k run is not a test: see docs/client-js-gateway.md for its command and figures.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { python, repoRoot } from "./support/daemon.js";

test("the gateway benchmark runs and judges both gateways OK at a small size", () => {
  const root = repoRoot();
  const run = spawnSync(python(), [
    join(root, "clients/js/bench/bench.py"), "--sessions", "300", "--keepalive", "1", "--duration", "9",
    "--ramp", "2.5", "--silent-fraction", "0.05", "--bye-fraction", "0.05",
  ], { env: { ...process.env, PYTHONPATH: root }, encoding: "utf8", timeout: 90_000 });
  const output = `${run.stdout}\n${run.stderr}`;
  assert.equal(run.status, 0, output);
  assert.match(output, /^node {3}OK: 300 attached, \d+ touches, online events 300 .*false offlines 0, missed 0, early 0/m);
  assert.match(output, /^python OK: 300 attached, \d+ touches, online events 300 .*false offlines 0, missed 0, early 0/m);
  assert.match(output, /silent 15, bye 15/);
  assert.match(output, /^ratio Python \/ Node: CPU per attach [\d.]+x, CPU per touch [\d.]+x$/m);
});
