/**
 * An elected pair for the leader-following tests: a real etcd (one member on 127.0.0.1, free ports, killed at
 * the end; idled/tools/etcd.py) and two `idled serve --election` cores on 127.0.0.2 and 127.0.0.3, same port
 * (idled/tools/bench/failover.py's Cluster). `settled()` waits until one leads and the other follows it caught
 * up, by their /status.
 */

import { spawn, execFileSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, closeSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Daemon, freePort, sleep } from "./daemon.js";

export function etcdBinary(): string | null {
  try {
    return execFileSync("sh", ["-c", "command -v etcd"], { encoding: "utf8" }).trim() || null;
  } catch {
    return null;
  }
}

export class Etcd {
  proc: ChildProcess | null = null;
  port = 0;
  constructor(readonly dir: string) {}

  async start(): Promise<this> {
    const binary = etcdBinary();
    if (binary === null) throw new Error("etcd not on PATH (Debian: etcd-server; .ci/system-deps installs it)");
    this.port = await freePort();
    const peer = `http://127.0.0.1:${await freePort()}`;
    const endpoint = `http://127.0.0.1:${this.port}`;
    const log = openSync(join(this.dir, "etcd.log"), "w");
    this.proc = spawn(binary, [
      "--name", "test", "--data-dir", join(this.dir, "etcd-data"),
      "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
      "--initial-cluster", `test=${peer}`, "--initial-cluster-state", "new",
      "--heartbeat-interval", "50", "--election-timeout", "500", // a one-member cluster elects itself fast
    ], { stdio: ["ignore", log, log] });
    closeSync(log);
    const limit = Date.now() + 15_000;
    for (;;) {
      try {
        const response = await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(1000) });
        if (((await response.json()) as { health?: string }).health === "true") return this;
      } catch {
        // not up yet
      }
      if (Date.now() > limit || this.proc.exitCode !== null) throw new Error("etcd did not become healthy");
      await sleep(50);
    }
  }

  url(prefix: string): string {
    return `etcd://127.0.0.1:${this.port}/${prefix}`;
  }

  kill(): void {
    if (this.proc && this.proc.exitCode === null) this.proc.kill("SIGKILL");
  }
}

export const HOSTS = ["127.0.0.2", "127.0.0.3"] as const;

export class Cluster {
  readonly dir = mkdtempSync(join(tmpdir(), "idled-js-cluster-"));
  readonly etcd = new Etcd(this.dir);
  nodes: Daemon[] = [];

  /** etcd, then both cores (TTL `ttl` seconds) on one free port. */
  async start(ttl = 2, args: string[] = []): Promise<this> {
    await this.etcd.start();
    const port = await freePort(HOSTS[0]);
    for (const [i, host] of HOSTS.entries()) {
      this.nodes.push(new Daemon({
        host, port, metricsPort: await freePort(), dataDir: join(this.dir, `data${i}`), timeout: 600,
        args: ["--election", this.etcd.url("js"), "--election-ttl", String(ttl), ...args],
      }));
    }
    await Promise.all(this.nodes.map((node) => node.start()));
    return this;
  }

  get addresses(): string[] {
    return this.nodes.map((node) => node.address);
  }

  /** The index of the leader once one leads and the other streams from it, caught up (three looks in a row). */
  async settled(timeout = 30): Promise<number> {
    const limit = Date.now() + timeout * 1000;
    let streak = 0;
    while (Date.now() < limit) {
      const docs = await Promise.all(this.nodes.map((node) => node.proc ? node.status() : Promise.resolve(null)));
      const roles = docs.map((doc) => doc?.role);
      const leader = roles.indexOf("leader");
      const standby = docs[1 - leader]?.standby as { state?: string; lag_records?: number } | undefined;
      const caughtUp = leader >= 0 && roles[1 - leader] === "standby" && standby?.state === "streaming"
        && (standby.lag_records ?? -1) >= 0 && (standby.lag_records ?? 99) <= 10;
      streak = caughtUp ? streak + 1 : 0;
      if (streak >= 3) return leader;
      await sleep(100);
    }
    throw new Error("the cores did not settle: " + this.nodes.map((n) => n.stderr().split("\n").slice(-4).join(" | ")).join(" ;; "));
  }

  /** SIGKILL core `i`. */
  async kill(i: number): Promise<void> {
    await this.nodes[i]!.stop("SIGKILL");
  }

  async close(): Promise<void> {
    await Promise.all(this.nodes.map((node) => node.stop("SIGTERM", 5)));
    this.etcd.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
