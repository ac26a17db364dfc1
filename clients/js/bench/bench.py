"""The gateway benchmark: a Node gateway and a Python gateway, N sessions each, against one `idled serve`,
judged by an independent observer; prints correctness and CPU per attach / per touch of both.

Theory of operation
-------------------
One run, every process on loopback and every one of them stopping by itself:

1. ``idled serve`` (``--tick``; ``--workers`` optional) on a free port, its data in a fresh directory.
2. The observer (observe.py), a process of its own, subscribed from seq 1: it records every event the daemon
   publishes, whoever caused it, until the cutoff plus a margin.
3. The plan (`idled.tools.loadtest.stats.make_plan`, seeded): which sessions go silent and which detach,
   each at a moment uniform in the *silent window* -- after every session was touched once (the attach
   burst is applied by the daemon over a second or two, so a session silent since its attach would be
   judged against a send the daemon read late), early enough that a session silent at its very end is owed
   its offline (timeout + two ticks) before the cutoff. The same plan drives
   both gateways; the Node gateway's uids are ``0..N-1``, the Python one's ``uid_base..uid_base+N-1``.
4. The two gateway processes (bench/gateway.ts built into dist/bench/gateway.js, and pygateway.py) start
   together at ``t0``: attach every session, then touch each on its schedule, silence and detach as planned,
   and stop at the cutoff plus a margin, each writing what it did (its last touch times, its `ended`
   notices) and its own process CPU time over the attach phase and over the touch phase.
5. The checker: the loadtest's `Matcher` (the same code that judges `idled loadtest --gateways`), one per
   gateway, fed the plan, the gateway's records and the observer's events up to the cutoff. A silent
   session's offline is judged against the gateway's own last touch call: before it + T is *early*, none by
   it + T + 2 ticks is *missed*; a pinger's offline is *false* unless the gateway's last two touches say it
   had not touched within T. Lateness is the offline's time minus (last touch + T).

The keepalive defaults to 30 s (the issue's target), the run to 150 s after t0: the window then holds ~70 s
of silencing (from 38 s to 104 s) and every session is touched ~5 times. Whole run at 100k sessions per
gateway: ~3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from idled.tools.loadtest.stats import Matcher, Plan, make_plan, silent_window

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent  # clients/js
HOST = "127.0.0.1"


def start_daemon(work: Path, tick: float, workers: int) -> tuple[subprocess.Popen[bytes], int]:
    stderr = (work / "idled.stderr").open("wb")
    command = [sys.executable, "-m", "idled.cli.main", "serve", "--host", HOST, "--port", "0", "--data-dir",
               str(work / "data"), "--metrics-port", "0", "--fsync", "never", "--tick", str(tick)]
    if workers:
        command += ["--workers", str(workers)]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    limit = time.monotonic() + 20
    while time.monotonic() < limit:
        for line in (work / "idled.stderr").read_text(errors="replace").splitlines():
            if line.startswith("IDLED_LISTENING"):
                return proc, int(line.rsplit("port=", 1)[1])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"bench: idled did not start:\n{(work / 'idled.stderr').read_text(errors='replace')}")


def read_events(path: Path) -> list[tuple[str, int, float, str, float, float]]:
    events = []
    for line in path.read_text().splitlines():
        kind, uid, ts, reason, deadline, last_seen = line.split(" ")
        events.append((kind, int(uid), float(ts), reason, float(deadline), float(last_seen)))
    return events


def judge(plan: Plan, result: dict[str, Any], events: list[tuple[str, int, float, str, float, float]],
          uid_base: int, t0: float, cutoff: float, tick: float, keepalive: float) -> dict[str, Any]:
    matcher = Matcher(plan, uid_base=uid_base, t0_wall=t0)
    for i, last in result["silent"]:
        matcher.silent(i, last)
    for i, sent in result["bye"]:
        matcher.bye(i, sent)
    for i, prev, last, at, how in result["closed"]:
        matcher.closed(i, prev, last, at, how)
    for i in range(result.get("attached", 0), plan.sessions):
        matcher.failed(i)
    for kind, uid, ts, reason, deadline, last_seen in events:
        if ts <= cutoff:
            matcher.event(kind, uid, ts, reason, deadline, last_seen)
    timeout = matcher.first_timeout if matcher.first_timeout is not None else 1.5 * keepalive
    verdict = matcher.judge(timeout=round(timeout, 3), tick=tick, cutoff=cutoff)
    return {"verdict": verdict.to_dict(), "lateness": verdict.lateness_generator.summary(),
            "server_lateness": verdict.lateness_server.summary()}


def build_node() -> Path:
    """Compile the package and the bench (tsc), once; the script to run."""
    subprocess.run(["npx", "tsc", "-p", str(HERE / "tsconfig.json")], cwd=PACKAGE, check=True)
    return PACKAGE / "dist" / "bench" / "gateway.js"


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="idled-gwbench-"))
    script = None if args.no_build else build_node()
    script = script or PACKAGE / "dist" / "bench" / "gateway.js"
    timeout = 1.5 * args.keepalive
    # Silencing starts once every session has been touched at least once (the first touch comes within
    # K after the attach): a session silent from its attach on would be judged against the attach call,
    # which the daemon applies only once it has read the whole burst (~1-2 s for 2 x 100k attaches).
    ramp_end = args.ramp if args.ramp is not None else args.keepalive * (1.0 + args.jitter) + 5.0
    window = silent_window(duration=args.duration, ramp_end=ramp_end, timeout=timeout, tick=args.tick)
    plan = make_plan(args.sessions, silent_fraction=args.silent_fraction, bye_fraction=args.bye_fraction,
                     window=window, seed=args.seed)
    special = [[i, kind, moment] for i, (kind, moment) in sorted(plan.special.items())]
    daemon, port = start_daemon(work, args.tick, args.workers)
    procs: list[subprocess.Popen[bytes]] = [daemon]
    try:
        t0 = time.time() + 3.0  # both gateway processes are up by then
        cutoff = t0 + args.duration
        stop = cutoff + 1.0  # the gateways keep touching past the cutoff: no offline of theirs is judged
        events_path = work / "events.txt"
        observer = subprocess.Popen([sys.executable, str(HERE / "observe.py"), "--port", str(port), "--out",
                                     str(events_path), "--ready", str(work / "ready"), "--until",
                                     str(stop + 1.5 + args.sessions / 50_000)])  # time to read the tail
        procs.append(observer)
        limit = time.monotonic() + 20
        while not (work / "ready").exists():
            if observer.poll() is not None or time.monotonic() > limit:
                raise SystemExit("bench: the observer did not subscribe")
            time.sleep(0.05)
        gateways = {"node": 0, "python": args.uid_base}
        runners: dict[str, subprocess.Popen[bytes]] = {}
        for lang, base in gateways.items():
            if lang in args.skip:
                continue
            spec = {"host": HOST, "port": port, "name": f"bench-{lang}", "sessions": args.sessions, "uid_base": base,
                    "keepalive": args.keepalive, "jitter": args.jitter, "tick": 0.1, "seed": args.seed,
                    "t0": t0, "stop": stop, "special": special, "result": str(work / f"{lang}.json")}
            (work / f"{lang}.spec.json").write_text(json.dumps(spec))
            command = (["node", str(script)] if lang == "node" else [sys.executable, str(HERE / "pygateway.py")])
            runners[lang] = subprocess.Popen([*command, str(work / f"{lang}.spec.json")])
            procs.append(runners[lang])
        print(f"bench: {len(runners)} gateway(s) x {args.sessions} sessions, keepalive {args.keepalive:g} s, "
              f"cutoff {args.duration:g} s after t0; planned {plan.counts()}; work dir {work}", flush=True)
        failed = [lang for lang, proc in runners.items() if proc.wait(args.duration + 120) != 0]
        observer.wait(30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    if failed:
        print(f"bench: FAILED: the {', '.join(failed)} gateway exited with an error")
        return 1
    events = read_events(events_path)
    report: dict[str, Any] = {"sessions": args.sessions, "keepalive": args.keepalive, "duration": args.duration,
                              "tick": args.tick, "events": len(events), "gateways": {}}
    ok = True
    for lang, base in gateways.items():
        if lang not in runners:
            continue
        result = json.loads((work / f"{lang}.json").read_text())
        judged = judge(plan, result, events, base, t0, cutoff, args.tick, args.keepalive)
        ok = ok and judged["verdict"]["ok"]
        report["gateways"][lang] = {**{k: v for k, v in result.items() if k not in ("silent", "bye", "closed")},
                                    **judged}
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print_report(report)
    if args.keep:
        print(f"bench: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def us(seconds: float, count: int) -> float:
    return 1e6 * seconds / count if count else float("nan")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def print_report(report: dict[str, Any]) -> None:
    per: dict[str, tuple[float, float]] = {}
    for lang, g in report["gateways"].items():
        v, late = g["verdict"], g["lateness"]
        per[lang] = (us(g["attach_cpu"], g["attached"]), us(g["touch_cpu"], g["touches"]))
        print(f"{lang:6} {'OK' if v['ok'] else 'FAILED'}: {g['attached']} attached, {g['touches']} touches, "
              f"online events {v['online_events']} (missing {v['online_missing']}, duplicate {v['online_duplicates']}); "
              f"silent {v['planned']['silent']}, bye {v['planned']['bye']}: false offlines {v['false_offlines']}, "
              f"missed {v['missed_offlines']}, early {v['early_offlines']}, duplicate {v['duplicate_offlines']}, "
              f"unjudged {v['unjudged_silent']}, logouts {v['logouts_seen']} (missed {v['missed_logouts']}), "
              f"generator late {v['generator_late']}")
        print(f"{'':6} lateness after last touch + T (T = {v['timeout']:g} s): p50 {ms(late['p50'])}, "
              f"p99 {ms(late['p99'])}, max {ms(late['max'])}, min {ms(late['min'])}; "
              f"ended notices {g['ended']}; connections {g['connections']}; frames {g['frames_sent']}")
        print(f"{'':6} CPU per attach {per[lang][0]:.2f} us ({g['attach_cpu']:.3f} s over {g['attach_wall']:.2f} s), "
              f"per touch {per[lang][1]:.2f} us ({g['touch_cpu']:.2f} s over {g['touch_wall']:.0f} s); "
              f"peak RSS {g['rss_max_kib'] / 1024:.0f} MiB")
    if "node" in per and "python" in per:
        (na, nt), (pa, pt) = per["node"], per["python"]
        print(f"ratio Python / Node: CPU per attach {pa / na:.2f}x, CPU per touch {pt / nt:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Node vs Python gateway against idled serve, judged by an observer")
    parser.add_argument("--sessions", type=int, default=100_000, help="sessions per gateway (default 100000)")
    parser.add_argument("--keepalive", type=float, default=30.0, help="seconds (default 30: timeout 45)")
    parser.add_argument("--duration", type=float, default=150.0, help="cutoff, seconds after t0 (default 150)")
    parser.add_argument("--ramp", type=float, default=None,
                        help="silencing starts this long after t0 (default: keepalive * (1 + jitter) + 5 s)")
    parser.add_argument("--jitter", type=float, default=0.1, help="touch interval K * U(1-j, 1+j) (default 0.1)")
    parser.add_argument("--silent-fraction", type=float, default=0.01)
    parser.add_argument("--bye-fraction", type=float, default=0.005)
    parser.add_argument("--tick", type=float, default=0.1, help="the daemon's --tick (default 0.1)")
    parser.add_argument("--workers", type=int, default=0, help="the daemon's --workers (default 0: one process)")
    parser.add_argument("--uid-base", type=int, default=10_000_000, help="the Python gateway's first uid")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", action="append", default=[], choices=["node", "python"])
    parser.add_argument("--no-build", action="store_true", help="use the dist/ already built")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (events, results, logs)")
    args = parser.parse_args(argv)
    if args.uid_base < args.sessions:
        parser.error("--uid-base must be at least --sessions (the two gateways' uids must not overlap)")
    if shutil.which("node") is None:
        parser.error("node is not on PATH")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
