// idled status page: polls status/live about once a second and draws everything (inline SVG, DOM text only:
// no innerHTML, uids are whatever clients sent). Read-only: it only ever GETs.
// With auth on, status/live answers 401 without the HTTP API's token: the page then shows what the redacted
// status holds and asks for a token, kept in sessionStorage only (this tab, until it closes; never in the URL
// or localStorage) and sent as "Authorization: Bearer".
"use strict";

const POLL_MS = 1000;
const TOKEN_KEY = "idled.apiToken"; // sessionStorage
const WINDOW_S = 600; // the charts' span: the daemon keeps ten minutes of one-second samples
const SVG = "http://www.w3.org/2000/svg";
const H = 170, LEFT = 48, RIGHT = 8, TOP = 10, BOTTOM = 22;

const state = { after: 0, since: null, history: [], events: [], limit: 100, uptime: null, role: null, timer: null,
                locked: false };

function $(id) { return document.getElementById(id); }

function text(id, value) { $(id).textContent = value; }

function number(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 2 });
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s === 0) return "0";
  if (s < 1) return `${Number((s * 1000).toPrecision(3))} ms`;
  return `${Number(s.toPrecision(3))} s`;
}

function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), r = s % 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m ${r}s`;
  return m ? `${m}m ${r}s` : `${r}s`;
}

function clock(ts) {
  const t = new Date(ts * 1000);
  return t.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(t.getMilliseconds()).padStart(3, "0");
}

function svg(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function label(parent, x, y, content, anchor = "end", cls = "") {
  const node = svg("text", { x, y, "text-anchor": anchor, class: cls }, parent);
  node.textContent = content;
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

// Empties a chart and sizes its coordinates to its width on the page (text stays at its CSS size); its width.
function reset(chart) {
  clear(chart);
  const width = Math.max(320, Math.round(chart.getBoundingClientRect().width) || 640);
  chart.setAttribute("viewBox", `0 0 ${width} ${H}`);
  return width;
}

// A line chart over the last WINDOW_S seconds: series = [{cls, points: [[t, v], ...]}].
function lineChart(chart, series, now) {
  const W = reset(chart);
  const top = Math.max(1, ...series.flatMap(s => s.points.map(p => p[1])));
  const scale = niceCeiling(top);
  const x = t => LEFT + (W - LEFT - RIGHT) * (1 - (now - t) / WINDOW_S);
  const y = v => TOP + (H - TOP - BOTTOM) * (1 - v / scale);
  for (const v of [0, scale / 2, scale]) {
    svg("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), class: "grid" }, chart);
    label(chart, LEFT - 4, y(v) + 4, number(v));
  }
  for (const [offset, name] of [[600, "−10 min"], [300, "−5 min"], [0, "now"]]) {
    label(chart, x(now - offset), H - 6, name, offset === 600 ? "start" : offset === 0 ? "end" : "middle");
  }
  for (const s of series) {
    const points = s.points.filter(p => now - p[0] <= WINDOW_S);
    if (points.length) {
      svg("polyline", { points: points.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "),
                        class: s.cls }, chart);
    }
  }
}

function niceCeiling(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// Logged-in connections of every role (not those still logging in).
function loggedIn(c) {
  return (c.user || 0) + (c.gateway || 0) + (c.observer || 0) + (c.standby || 0);
}

function drawHistory(now) {
  const h = state.history;
  lineChart($("chart-sessions"), [
    { cls: "connections", points: h.map(s => [s.t, loggedIn(s.connections)]) },
    { cls: "users", points: h.map(s => [s.t, s.users]) },
    { cls: "sessions", points: h.map(s => [s.t, s.sessions]) },
  ], now);
  const rate = [];
  for (let i = 1; i < h.length; i++) {
    const dt = h[i].t - h[i - 1].t;
    if (dt > 0) rate.push([h[i].t, (h[i].events - h[i - 1].events) / dt]);
  }
  lineChart($("chart-rate"), [{ cls: "rate", points: rate }], now);
}

// The lateness histogram: one bar per bucket (le = its upper bound; null = +Inf), the percentiles' buckets marked.
function drawLateness(lateness) {
  const chart = $("chart-lateness");
  const W = reset(chart);
  for (const id of ["p50", "p90", "p99", "p99_9", "mean"]) text(id, lateness ? seconds(lateness[id]) : "–");
  text("lateness-count", lateness ? number(lateness.count) : "–");
  text("card-p99", lateness ? seconds(lateness.p99) : "–");
  text("card-count", !lateness ? "–" : lateness.count ? `over ${number(lateness.count)} idle ${
    lateness.count === 1 ? "offline" : "offlines"}` : "no idle offline yet");
  if (!lateness) {
    label(chart, W / 2, H / 2, state.role === "standby" ? "none on a standby: its leader times the sessions"
      : "no lateness histogram (metrics off)", "middle", "empty");
    return;
  }
  const buckets = lateness.buckets;
  const top = Math.max(1, ...buckets.map(b => b.count));
  const slot = (W - LEFT - RIGHT) / buckets.length;
  const y = v => TOP + 12 + (H - TOP - 12 - BOTTOM) * (1 - v / top);
  for (const v of [0, top]) label(chart, LEFT - 4, y(v) + 4, number(v));
  const marks = {};
  for (const name of ["p50", "p90", "p99"]) {
    if (lateness[name] !== null) (marks[lateness[name]] = marks[lateness[name]] || []).push(name);
  }
  buckets.forEach((b, i) => {
    const bar = svg("rect", { x: LEFT + i * slot + 1, width: Math.max(1, slot - 2), y: y(b.count),
                              height: Math.max(0, y(0) - y(b.count)), class: "bar" }, chart);
    bar.dataset.le = b.le === null ? "+Inf" : b.le;
    bar.dataset.count = b.count;
    const title = svg("title", {}, bar);
    title.textContent = `≤ ${b.le === null ? "∞" : seconds(b.le)}: ${b.count}`;
    const mark = b.le !== null && marks[b.le];
    if (mark) {
      bar.classList.add("marked");
      label(chart, LEFT + (i + 0.5) * slot, y(b.count) - 3, mark.join(" "), "middle", "mark");
    }
    if (i % Math.ceil(buckets.length / 8) === 0 || i === buckets.length - 1) {
      label(chart, LEFT + (i + 0.5) * slot, H - 6, b.le === null ? "∞" : seconds(b.le), "middle");
    }
  });
  if (!lateness.count) label(chart, W / 2, H / 2, "no idle offline yet", "middle", "empty");
}

function cell(row, content, cls) {
  const td = row.insertCell();
  td.textContent = content === null || content === undefined ? "" : String(content);
  if (cls) td.className = cls;
  return td;
}

function drawEvents(fresh) {
  const body = $("events");
  for (const e of fresh) {
    const row = body.insertRow(0);
    row.className = "new";
    row.dataset.seq = e.seq;
    row.dataset.uid = String(e.uid);
    row.dataset.kind = e.kind;
    cell(row, e.seq);
    cell(row, clock(e.ts));
    cell(row, e.kind, `kind-${e.kind}`);
    cell(row, e.uid, "uid");
    cell(row, e.device);
    cell(row, e.reason);
    cell(row, e.kind === "offline" && e.reason === "idle" ? seconds(Math.max(0, e.ts - e.deadline)) : "");
  }
  while (body.rows.length > state.limit) body.deleteRow(body.rows.length - 1);
  $("events-none").hidden = body.rows.length > 0;
}

function drawWorkers(workers) {
  $("workers-table").hidden = !workers;
  $("workers-none").hidden = !!workers;
  const body = $("workers");
  clear(body);
  for (const w of workers || []) {
    const row = body.insertRow();
    cell(row, w.name);
    cell(row, w.up ? "up" : "down", w.up ? "state-up" : "state-down");
    cell(row, w.pid === null ? "–" : w.pid);
    cell(row, w.restarts);
    cell(row, number(w.sessions));
    cell(row, number(w.connections));
  }
}

const CONFIG = [
  ["tick", seconds], ["timeout", seconds], ["max_timeout", seconds], ["detector", String],
  ["fsync", (v, c) => v === "interval" ? `every ${seconds(c.fsync_interval)}` : v],
  // the limit in force; the configured one and why, when the descriptor budget capped it
  ["max_connections", (v, c) => c.max_connections_configured === undefined ? number(v)
    : `${number(v)} (${number(c.max_connections_configured)} configured; capped: ${c.max_connections_why})`],
  ["max_devices", number], ["max_frame", v => `${number(v)} bytes`],
  ["login_timeout", seconds], ["offline_grace", seconds], ["workers", v => v || "none"],
  ["auth", v => v ? "on" : "OFF"], ["tls", v => v ? "on" : "off"], ["proxy_protocol", v => v ? "on" : "off"],
];

function drawConfig(config) {
  const list = $("config");
  if (list.childElementCount || !config) return; // it changes only with a reload: drawn once per page load
  for (const [key, format] of CONFIG) {
    if (!(key in config)) continue;
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = key.replace(/_/g, " ");
    dd.textContent = format(config[key], config);
    list.append(dt, dd);
  }
}

// The role, the leader and replication: what a core (active, leader) or a standby says of its place in a cluster.
function clusterRows(doc) {
  const rows = [];
  const since = doc.role_seconds === undefined ? "" : ` for ${duration(doc.role_seconds)}`;
  const lease = doc.election && doc.election.lease_left !== undefined ? `; lease ${doc.election.lease_left.toFixed(1)} s left` : "";
  rows.push(["role", doc.role === "leader" ? `leader${since} (elected${lease})`
    : doc.role === "standby" ? `standby${since}` : String(doc.role || "–")]);
  if (doc.leader) rows.push(["leader", doc.role === "standby" ? doc.leader : `${doc.leader} (this core)`]);
  const r = doc.replication;
  if (r) {
    const each = (r.standbys || []).map(s => {
      const behind = r.log_durable_seq === undefined ? "" : ` (${number(Math.max(0, r.log_durable_seq - Math.max(s.acked, 0)))} behind)`;
      return `${s.name || "standby"} ${s.acked >= 0 ? `acked seq ${number(s.acked)}` : "no ack yet"}${behind}`;
    });
    rows.push(["replication", (each.length ? each.join(", ") : "no standby attached") + `; sync ${r.sync_standby ? "on" : "off"}`]);
  }
  const l = doc.standby;
  if (l) {
    rows.push(["replication", `${l.state}${l.active ? ` from ${l.active}` : ""}: last seq ${number(l.last_seq)}, `
      + `${number(l.lag_records)} records behind (${l.lag_seconds ? seconds(l.lag_seconds) : "0 s"})`]);
    if (l.error) rows.push(["link error", l.error]);
  }
  return rows;
}

function drawCluster(doc) {
  const role = $("role");
  role.textContent = doc.role === "standby" && doc.leader ? `standby of ${doc.leader}` : String(doc.role || "–");
  role.className = "badge";
  const list = $("cluster");
  clear(list);
  for (const [key, value] of clusterRows(doc)) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = key;
    dd.textContent = value;
    list.append(dt, dd);
  }
}

function drawStatus(doc) {
  text("version", `v${doc.version}`);
  text("uptime", duration(doc.uptime_seconds));
  drawCluster(doc);
  const ready = $("ready");
  ready.textContent = doc.ready ? "ready" : `not ready: ${doc.ready_reason}`;
  ready.className = `badge ${doc.ready ? "ok" : "bad"}`;
  text("sessions", number(doc.sessions_online));
  text("users", `${number(doc.users_online)} ${doc.users_online === 1 ? "user" : "users"}`);
  const c = doc.connections || {};
  if (doc.workers) { // the core's own connections are the edges' links: count what the workers hold
    text("connections", number(doc.workers.reduce((a, w) => a + w.connections, 0)));
    text("connections-by-role", `on ${doc.workers.length} workers · core: ${number(c.gateway)} links`);
  } else {
    text("connections", number(loggedIn(c)));
    text("connections-by-role", `${number(c.user)} user · ${number(c.gateway)} gateway · ${number(c.observer)} observer`
      + (c.standby ? ` · ${number(c.standby)} standby` : "")
      + (c.pending ? ` · ${number(c.pending)} logging in` : ""));
  }
  const rates = (doc.vitals && doc.vitals.rates) || {};
  text("rate-10s", number(rates.events_per_second_10s));
  text("rate-1m", number(rates.events_per_second_1m));
  text("next-seq", number(doc.next_seq));
  text("stopping", doc.stopping ? "shutting down" : "\u00a0");
}

function apply(doc) {
  // Restarted, or another role now (promoted, stepped down: other events, other figures): start over.
  if ((state.uptime !== null && doc.uptime_seconds < state.uptime) || (state.role !== null && doc.role !== state.role)) {
    Object.assign(state, { after: 0, since: null, history: [], events: [], uptime: null, role: null });
    clear($("events"));
    return false;
  }
  state.uptime = doc.uptime_seconds;
  state.role = doc.role;
  // A standby has no vitals of its own (no presence table): empty figures, not a failed poll.
  const v = Object.assign({ history: [], recent_events: [], lateness: null }, doc.vitals);
  state.limit = v.recent_limit || state.limit;
  state.history.push(...v.history);
  const now = state.history.length ? state.history[state.history.length - 1].t : Date.now() / 1000;
  state.history = state.history.filter(s => now - s.t <= WINDOW_S);
  if (v.history.length) state.since = v.history[v.history.length - 1].t;
  if (v.recent_events.length) state.after = v.recent_events[v.recent_events.length - 1].seq;
  drawStatus(doc);
  drawEvents(v.recent_events);
  drawHistory(now);
  drawLateness(v.lateness);
  drawWorkers(doc.workers);
  drawConfig(doc.config);
  text("updated", new Date().toLocaleTimeString("en-GB", { hour12: false }));
  return true;
}

function setLink(ok, error) {
  const link = $("link");
  link.textContent = ok ? "live" : "disconnected";
  link.className = `badge ${ok ? "ok" : "bad"}`;
  text("error", ok ? "" : `last poll failed: ${error}`);
}

function storedToken() {
  try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
}

// The daemon's reason for a 401 ({"error": {"message": ...}}), or its status line.
async function refusal(response) {
  try { return (await response.json()).error.message; } catch (e) { return `${response.status} ${response.statusText}`; }
}

// Forgets what the last token showed (the events, the charts) and shows the token form; `refused`: the
// daemon's reason for refusing the token just sent, shown until another is entered.
function lock(refused) {
  if (!state.locked) {
    Object.assign(state, { after: 0, since: null, history: [], events: [], uptime: null, locked: true });
    clear($("events"));
    drawHistory(Date.now() / 1000);
  }
  $("auth").hidden = false;
  $("forget").hidden = true;
  if (refused) text("auth-error", `The token was refused: ${refused}. Enter another API token.`);
  $("events-none").hidden = false;
  text("events-none", "The last events need an API token.");
  const link = $("link");
  link.textContent = "token needed";
  link.className = "badge bad";
}

function unlock() {
  state.locked = false;
  $("auth").hidden = true;
  text("events-none", "No event yet.");
}

// Locked: the redacted /status (how the daemon is: counts, readiness, configuration) for the cards.
async function pollRedacted() {
  const response = await fetch("status", { cache: "no-store" });
  if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
  const doc = await response.json();
  drawStatus(doc);
  text("rate-1m", number(doc.events_per_second));
  drawLateness(doc.lateness ? { ...doc.lateness, buckets: [] } : null); // its percentiles, not its buckets
  drawWorkers(doc.workers);
  drawConfig(doc.config);
  text("error", "");
  text("updated", new Date().toLocaleTimeString("en-GB", { hour12: false }));
}

async function poll() {
  state.timer = null;
  const query = new URLSearchParams({ after: String(state.after) });
  if (state.since !== null) query.set("since", String(state.since));
  let again = POLL_MS;
  try {
    const sent = storedToken();
    const headers = sent ? { Authorization: `Bearer ${sent}` } : {};
    const response = await fetch(`status/live?${query}`, { cache: "no-store", headers });
    if (response.status === 401 && storedToken() !== sent) {
      again = 0; // a token was entered (or forgotten) while this request was under way: ask again with it
    } else if (response.status === 401) {
      const why = await refusal(response);
      if (sent) sessionStorage.removeItem(TOKEN_KEY); // refused: never sent again
      lock(sent ? why : null);
      await pollRedacted();
    } else {
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      if (state.locked) unlock();
      $("forget").hidden = !sent; // (a tab reloaded with its token: not locked before)
      if (!apply(await response.json())) again = 0;
      setLink(true);
    }
  } catch (error) {
    setLink(false, error.message || error);
  }
  state.timer = setTimeout(poll, again); // one request at a time: the next starts after this one ended
}

// Polls at once (a token entered or forgotten), unless a poll is under way: its end schedules the next.
function pollNow() {
  if (state.timer === null) return;
  clearTimeout(state.timer);
  poll();
}

$("auth-form").addEventListener("submit", event => {
  event.preventDefault(); // never submitted anywhere: the token stays in this tab
  const input = $("token");
  const token = input.value.trim();
  input.value = "";
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  text("auth-error", "");
  $("auth").hidden = true;
  pollNow();
});

$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  text("auth-error", "");
  lock(null);
  pollNow();
});

poll();
