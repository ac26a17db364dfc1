/**
 * The benchmark's scenario driven through this package's Node `Gateway`: the twin of pygateway.py (read its
 * theory of operation: the same schedule, the same records), so the two compare call for call.
 *
 * Run by bench.py as `node dist/bench/gateway.js SPEC.json`. At t0 it attaches every session, one
 * `attach([uid], K)` call each, and flushes: process CPU time (`process.cpuUsage()`, every thread) over that
 * span divided by N is the CPU per attach. Then a wheel of 0.1 s slots touches each session on its own
 * schedule, one `touch([uid])` call each, and silences / detaches the planned ones at their moments; the CPU
 * time from the end of the attach to the stop, over the touches made, is the CPU per touch (timers, frames,
 * notices included). It writes what it did to the spec's `result` file and exits.
 */

import { readFileSync, writeFileSync } from "node:fs";
import { openGateway } from "../src/gateway.js";
import type { SessionKey } from "../src/protocol/messages.js";

interface Spec {
  host: string; port: number; name: string; sessions: number; uid_base: number; keepalive: number;
  jitter: number; tick: number; seed: number; t0: number; stop: number; special: [number, number, number][];
  result: string;
}

const SILENT = 1;

/** Wall clock in unix seconds, sub-millisecond (what the daemon's event times are compared with). */
const wall = (): number => (performance.timeOrigin + performance.now()) / 1000;
const cpu = (): number => {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1e6;
};
const sleep = (seconds: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(0, seconds) * 1000));

/** A small seeded generator (mulberry32): the schedule is reproducible, and independent of Math.random. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function main(): Promise<void> {
  const spec = JSON.parse(readFileSync(process.argv[2]!, "utf8")) as Spec;
  const { sessions: n, uid_base: base, keepalive, jitter, tick: width } = spec;
  const special = new Map<number, [number, number]>(spec.special.map(([i, kind, moment]) => [i, [kind, moment]]));
  const random = rng(spec.seed);
  const prev = new Float64Array(n);
  const last = new Float64Array(n);
  const stopped = new Uint8Array(n);
  const closed: [number, number, number, number, string][] = [];
  const ended: Record<string, number> = {};

  const gw = openGateway({
    host: `${spec.host}:${spec.port}`, name: spec.name, backoff: { base: 0.05, cap: 1 },
    onEnded: (keys: SessionKey[], reason: string) => {
      const at = wall();
      ended[reason] = (ended[reason] ?? 0) + keys.length;
      for (const key of keys) {
        const i = typeof key === "number" ? key - base : -1;
        if (i >= 0 && i < n && !stopped[i]) closed.push([i, prev[i]!, last[i]!, at, `ended:${reason}`]);
      }
    },
  });
  await gw.waitConnected();
  await sleep(spec.t0 - wall());

  const cpu0 = cpu();
  const wall0 = wall();
  for (let i = 0; i < n; i++) {
    gw.attach([base + i], keepalive);
    prev[i] = last[i] = wall();
    if (i % 1000 === 999) await new Promise((r) => setImmediate(r)); // let the reader run, as a server would
  }
  await gw.flush();
  const cpu1 = cpu();
  const wall1 = wall();

  const slots = Math.ceil((keepalive * (1 + jitter)) / width) + 3;
  const ring: number[][] = Array.from({ length: slots }, () => []);
  for (let i = 0; i < n; i++) ring[(1 + Math.floor((keepalive * (0.05 + 0.95 * random())) / width)) % slots]!.push(i);
  const silent: [number, number][] = [];
  const bye: [number, number][] = [];
  let touches = 0;
  const start = performance.now() / 1000;
  for (let slot = 1; wall() < spec.stop; slot++) {
    await sleep(start + slot * width - performance.now() / 1000);
    const k = slot % slots;
    const due = ring[k]!;
    ring[k] = [];
    const now = wall();
    const rel = now - spec.t0;
    for (const i of due) {
      const entry = special.get(i);
      if (entry !== undefined && rel >= entry[1]) {
        stopped[i] = 1;
        if (entry[0] === SILENT) silent.push([i, last[i]!]);
        else {
          gw.detach([base + i]);
          bye.push([i, wall()]);
        }
        continue;
      }
      gw.touch([base + i]);
      prev[i] = last[i]!;
      last[i] = wall();
      touches++;
      ring[(slot + Math.max(1, Math.floor((keepalive * (1 - jitter + 2 * jitter * random())) / width))) % slots]!.push(i);
    }
  }
  await gw.flush();
  const cpu2 = cpu();
  const result = {
    lang: "node", sessions: n, attached: n, attach_cpu: cpu1 - cpu0, attach_wall: wall1 - wall0,
    touches, touch_cpu: cpu2 - cpu1, touch_wall: wall() - wall1, silent, bye, closed, ended,
    connections: gw.connections, frames_sent: gw.framesSent, rss_max_kib: process.resourceUsage().maxRSS,
    last_error: gw.lastError === null ? null : String(gw.lastError),
  };
  await gw.close();
  writeFileSync(spec.result, JSON.stringify(result));
}

await main();
