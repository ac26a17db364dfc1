// The browser build: dist/src/browser.js (tsc's output) bundled with its one dependency into one minified ESM
// file, dist/idled.browser.js; prints its size and gzipped size (the target is <= 15 KiB gzipped).
import { build } from "esbuild";
import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const out = "dist/idled.browser.js";
await build({
  entryPoints: ["src/browser.ts"],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  platform: "browser",
  outfile: out,
  legalComments: "none",
});
const bytes = readFileSync(out);
const gz = gzipSync(bytes, { level: 9 }).length;
console.log(`${out}: ${(bytes.length / 1024).toFixed(1)} KiB, ${(gz / 1024).toFixed(1)} KiB gzipped`);
