/**
 * The browser side of the tests: a static site on loopback (node:http) serving the browser build and the test
 * page, with `POST /report` where the page reports what it sees; and a headless Chromium (Debian's
 * /usr/bin/chromium, no driver, no download) opened on a URL and killed with its process group at the end.
 * The page drives itself; the test reads its reports -- no DevTools protocol needed.
 */

import { spawn, execFileSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { createServer } from "node:http";
import type { Server } from "node:http";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, normalize } from "node:path";

export function chromiumBinary(): string | null {
  for (const name of ["chromium", "chromium-browser"]) {
    try {
      const path = execFileSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" }).trim();
      if (path) return path;
    } catch {
      // not this one
    }
  }
  return null;
}

export interface Report { kind: string; order: number; [field: string]: unknown }

/** `files` (URL path -> file on disk) served on 127.0.0.1, and the page's reports. */
export class Site {
  reports: Report[] = [];
  port = 0;
  private server: Server | null = null;

  constructor(private readonly files: Record<string, string>) {}

  async start(): Promise<this> {
    this.server = createServer((request, response) => {
      if (request.method === "POST" && request.url === "/report") {
        let body = "";
        request.on("data", (chunk: Buffer) => { body += chunk.toString(); });
        request.on("end", () => {
          this.reports.push(JSON.parse(body) as Report);
          response.end("ok");
        });
        return;
      }
      const path = normalize(new URL(request.url ?? "/", "http://x").pathname);
      const file = this.files[path];
      if (file === undefined) {
        response.writeHead(404).end();
        return;
      }
      const type = path.endsWith(".js") ? "text/javascript" : "text/html";
      response.writeHead(200, { "content-type": type, "cache-control": "no-store" }).end(readFileSync(file));
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    const address = this.server.address();
    this.port = typeof address === "object" && address ? address.port : 0;
    return this;
  }

  get origin(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  of(kind: string): Report[] {
    return [...this.reports].sort((a, b) => a.order - b.order).filter((r) => r.kind === kind);
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      this.server?.closeAllConnections();
      this.server?.close(() => resolve());
    });
  }
}

const FLAGS = [
  "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions", "--disable-default-apps",
  "--mute-audio",
];

/** A headless Chromium showing `url`, in a process group of its own (so `close()` ends its helpers too). */
export class Chromium {
  private proc: ChildProcess | null = null;
  private readonly profile = mkdtempSync(join(tmpdir(), "idled-js-chromium-"));

  open(url: string): this {
    const binary = chromiumBinary();
    if (binary === null) throw new Error("chromium not on PATH (Debian: chromium; .ci/system-deps installs it)");
    this.proc = spawn(binary, [...FLAGS, `--user-data-dir=${this.profile}`, url], { stdio: "ignore", detached: true });
    return this;
  }

  async close(): Promise<void> {
    const proc = this.proc;
    if (proc?.pid !== undefined && proc.exitCode === null) {
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      try {
        process.kill(-proc.pid, "SIGKILL");
      } catch {
        // already gone
      }
      await exited;
    }
    rmSync(this.profile, { recursive: true, force: true });
  }
}
