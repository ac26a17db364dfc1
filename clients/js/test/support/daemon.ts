/**
 * A real `idled serve` for the tests: a subprocess on a free loopback port with a temporary data directory,
 * started and stopped by the test (the Node twin of tests/peers.py's Daemon and tests/client/support.py's Idled).
 *
 * The interpreter: `IDLED_PYTHON` if set; else the repository's own venv (`<repo>/.venv/bin/python`, what CI
 * builds); else the shared development venv (`/work/main/.venv/bin/python`); else `python3`. `PYTHONPATH` is the
 * repository root, so the checkout under test is the idled that runs. `start()` resolves once the daemon prints
 * `IDLED_LISTENING ... port=N`; `stop()` sends SIGTERM, then SIGKILL after a grace; `restart()` keeps the port
 * and the data directory, so clients reconnect to the same address and the event log continues.
 */

import { spawn, execFileSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the first directory above this file holding pyproject.toml and idled/. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "pyproject.toml")) && existsSync(join(dir, "idled"))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error("the idled repository root was not found above " + fileURLToPath(import.meta.url));
    dir = up;
  }
}

export function python(): string {
  if (process.env.IDLED_PYTHON) return process.env.IDLED_PYTHON;
  for (const candidate of [join(repoRoot(), ".venv/bin/python"), "/work/main/.venv/bin/python"]) {
    if (existsSync(candidate)) return candidate;
  }
  return "python3";
}

function env(): NodeJS.ProcessEnv {
  return { ...process.env, PYTHONPATH: repoRoot(), PYTHONUNBUFFERED: "1" };
}

/** A loopback port nobody listens on right now. */
export function freePort(host = "127.0.0.1"): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, host, () => {
      const address = server.address();
      server.close(() => resolvePort(typeof address === "object" && address ? address.port : 0));
    });
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Poll `condition` every 20 ms until it is true; fails naming `what` after `timeout` seconds. */
export async function until(condition: () => boolean, what: string, timeout = 20): Promise<void> {
  const limit = Date.now() + timeout * 1000;
  while (!condition()) {
    if (Date.now() > limit) throw new Error(`${what}: not within ${timeout} s`);
    await sleep(20);
  }
}

// A test file that fails or is interrupted must not leave daemons behind: SIGKILL what is still running.
const live = new Set<{ kill(): void }>();
process.once("exit", () => {
  for (const daemon of live) daemon.kill();
});

export interface DaemonOptions {
  /** `--workers N`: edge processes in front of the core. */
  workers?: number;
  /** Auth on: a secret file is written and passed as `--secret-file`; mint tokens with `token()`. */
  auth?: boolean;
  /** The listening host (default 127.0.0.1). */
  host?: string;
  /** A fixed port (default: a free one, kept across restarts). */
  port?: number;
  /** Default `--tick 0.1 --timeout 1 --fsync never --metrics-port 0`, as tests/client/support.py. */
  tick?: number;
  timeout?: number;
  /** A fixed /metrics (and /status) port (default 0: none the test can reach). */
  metricsPort?: number;
  /** More `idled serve` arguments (last: they win). */
  args?: string[];
  /** A data directory of the caller's (default: one in the daemon's temporary directory). */
  dataDir?: string;
  /** Seconds to wait for IDLED_LISTENING. Default 20. */
  startTimeout?: number;
}

export class Daemon {
  readonly dir: string;
  readonly dataDir: string;
  readonly host: string;
  port = 0;
  secretFile: string | null = null;
  proc: ChildProcess | null = null;
  runs = 0;
  private stderrPath = "";

  constructor(readonly options: DaemonOptions = {}) {
    this.dir = mkdtempSync(join(tmpdir(), "idled-js-"));
    this.dataDir = options.dataDir ?? join(this.dir, "data");
    this.host = options.host ?? "127.0.0.1";
    if (options.auth) {
      this.secretFile = join(this.dir, "secret");
      writeFileSync(this.secretFile, "test-secret-of-at-least-16-bytes\n", { mode: 0o600 });
    }
  }

  /** "host:port" of the listener. */
  get address(): string {
    return `${this.host}:${this.port}`;
  }

  command(): string[] {
    const o = this.options;
    return [
      python(), "-m", "idled.cli.main", "serve", "--host", this.host, "--port", String(this.port),
      "--data-dir", this.dataDir, "--metrics-port", String(o.metricsPort ?? 0), "--tick", String(o.tick ?? 0.1),
      "--timeout", String(o.timeout ?? 1), "--fsync", "never",
      ...(o.workers ? ["--workers", String(o.workers)] : []),
      ...(this.secretFile ? ["--secret-file", this.secretFile] : []),
      ...(o.args ?? []),
    ];
  }

  async start(): Promise<this> {
    if (this.port === 0) this.port = this.options.port ?? (await freePort(this.host));
    this.runs += 1;
    this.stderrPath = join(this.dir, `idled-${this.runs}.stderr`);
    const fd = openSync(this.stderrPath, "w");
    const [cmd, ...args] = this.command();
    const proc = spawn(cmd!, args, { env: env(), stdio: ["ignore", "ignore", fd] });
    closeSync(fd);
    this.proc = proc;
    live.add(this);
    proc.once("exit", () => live.delete(this));
    const limit = Date.now() + (this.options.startTimeout ?? 20) * 1000;
    while (!this.stderr().includes("IDLED_LISTENING")) {
      if (proc.exitCode !== null || proc.signalCode !== null) {
        throw new Error(`idled exited early (${proc.exitCode ?? proc.signalCode}):\n${this.stderr()}`);
      }
      if (Date.now() > limit) {
        this.kill();
        throw new Error(`idled did not start listening:\n${this.stderr()}`);
      }
      await sleep(20);
    }
    return this;
  }

  stderr(): string {
    try {
      return readFileSync(this.stderrPath, "utf8");
    } catch {
      return "";
    }
  }

  /** Send `signal` (SIGTERM by default) and wait for the exit; SIGKILL after `grace` seconds. The exit code. */
  async stop(signal: NodeJS.Signals = "SIGTERM", grace = 20): Promise<number | null> {
    const proc = this.proc;
    if (proc === null) return null;
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise<void>((r) => proc.once("exit", () => r()));
      proc.kill(signal);
      const timer = setTimeout(() => proc.kill("SIGKILL"), grace * 1000);
      await exited;
      clearTimeout(timer);
    }
    this.proc = null;
    return proc.exitCode;
  }

  /** SIGTERM, wait, start again on the same port and data directory. */
  async restart(): Promise<void> {
    const code = await this.stop();
    if (code !== 0) throw new Error(`idled exited ${code} on SIGTERM:\n${this.stderr()}`);
    await this.start();
  }

  /** SIGKILL now (synchronously; for cleanup paths). */
  kill(): void {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
  }

  /** Stop and remove the temporary directory. */
  async close(): Promise<void> {
    await this.stop("SIGTERM", 5);
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** The last seq published so far (0 for a new log): an observer subscribed from 0 queries nothing, and the
   * status comes after every event published before the query. */
  async lastSeq(): Promise<number> {
    const { Observer } = await import("../../src/index.js");
    const observer = new Observer({ host: this.address, name: "seq-probe", after: 0, durable: false }).start();
    let last = 0;
    observer.on("event", (e) => { last = e.seq; });
    await observer.query([]);
    await observer.close(0);
    return last;
  }

  /** The daemon's /status document (needs `metricsPort`); null while it does not answer. */
  async status(): Promise<Record<string, unknown> | null> {
    try {
      const response = await fetch(`http://127.0.0.1:${this.options.metricsPort}/status`, { signal: AbortSignal.timeout(2000) });
      return (await response.json()) as Record<string, unknown>;
    } catch {
      return null;
    }
  }

  /** A token for `role` `name` (`idled token`); needs `auth: true`. */
  token(role: "uid" | "gateway" | "observer", name: string | number, ttl = 3600): string {
    if (this.secretFile === null) throw new Error("token(): the daemon was started without auth");
    return execFileSync(python(), ["-m", "idled.cli.main", "token", "--secret-file", this.secretFile,
      `--${role}`, String(name), "--ttl", String(ttl)], { env: env(), encoding: "utf8" }).trim();
  }
}

/** A started daemon (see `Daemon`). */
export async function startDaemon(options: DaemonOptions = {}): Promise<Daemon> {
  return new Daemon(options).start();
}

export { resolve as resolvePath };
