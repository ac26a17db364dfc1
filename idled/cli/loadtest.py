"""`idled loadtest`: drive a server with real connections and check every presence event it emits.

The flags (`idled.cli.loadtestflags`) become a `Scenario` here (every check that can fail is made before anything starts: the
scenario's arithmetic, the output files, matplotlib for ``--plot``, the secret); the run itself is
`idled.tools.loadtest.run.run_scenario`, once, or once per detector for ``--compare ring,scan,heap`` (each
against a freshly spawned server, side by side with the ring's ratios to each baseline).
``--event-rate RATE --target HOST:PORT`` measures something else: event-to-subscriber latency at a steady
presence-event rate (`idled.tools.loadtest.eventrate`).

The JSON document (``--json``) holds the configuration, the verdict, the targets, the percentile summaries
and an ``.hgrm``-style table of both lateness measures, and the time series. The verdict is OK only when
the run completed, every event was right, and no target FAILED; the exit status says the same (see the
table, `idled.ops.fatal`, shown in `--help`).
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import json
import math
import os
import resource
import shlex
import sys
import time
from dataclasses import replace
from typing import Any

import trio

from idled.cli.loadtestflags import DEFAULT_DURATION, DEFAULT_EVENT_RATE_SECONDS, add_arguments
from idled.ops.config import MAX_WORKERS
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_TARGET_FAILED, EXIT_USAGE
from idled.protocol import MAX_KEEPALIVE, MIN_KEEPALIVE
from idled.protocol.address import AddressError, parse_address
from idled.tools.loadtest import mqtt, peer
from idled.tools.loadtest.ipc import IpcError
from idled.tools.loadtest.mosquitto import find_mosquitto, mosquitto_version
from idled.tools.loadtest.observer import ObserverLost
from idled.tools.loadtest.rates import sweep_rows, sweep_table
from idled.tools.loadtest.report import asks_text, clean_json, compare_ratios, compare_text, plot_results, summary_text
from idled.tools.loadtest.run import run_scenario
from idled.tools.loadtest.scenario import (
    DEFAULT_RAMP_GATEWAY_SESSIONS, DEFAULT_RAMP_USERS, MAX_PER_WORKER, SOURCES_PER, Scenario, flag_value,
    without_flag,
)

__all__ = ["UsageError", "add_arguments", "run", "parse_target", "scenario_from_args", "exit_status"]

class UsageError(Exception):
    pass


# --------------------------------------------------------------------------------------- validation


def parse_target(text: str) -> tuple[str, int]:
    """HOST:PORT (the one address grammar, ``idled.protocol.address``) with HOST a 127.0.0.0/8 address or
    `localhost`; UsageError otherwise."""
    try:
        host, port = parse_address(text)
    except AddressError as exc:
        raise UsageError(f"--target: {exc}") from None
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--target host must be a loopback IPv4 address, got {host!r}") from None
    if addr.version != 4 or not addr.is_loopback:
        raise UsageError(f"only loopback targets are accepted (127.0.0.0/8), got {host}")
    return str(addr), port


def _where(args: argparse.Namespace) -> tuple[bool, tuple[str, int] | None, list[str]]:
    """(spawn, target, server argv), checked against each other."""
    server_argv = shlex.split(args.server_args or "") + list(args.server_argv or [])
    spawn = bool(args.spawn or args.compare or args.sweep_workers or args.peer)
    if args.target and spawn:
        raise UsageError("give either --target or --spawn/--compare/--sweep-workers/--peer, not both")
    if not args.target and not spawn:
        raise UsageError("give --target HOST:PORT or --spawn")
    if server_argv and not spawn:
        raise UsageError("server flags are only used with --spawn / --compare")
    return spawn, (parse_target(args.target) if args.target else None), server_argv


def _sizing(args: argparse.Namespace) -> tuple[str, int, int, tuple[str, ...]]:
    """(mode, sessions, workers, source addresses), within this process's open-file limit."""
    if args.gateways < 0 or args.sessions < 0 or args.connections < 0:
        raise UsageError("counts must be >= 0")
    if args.gateways:
        mode, sessions = "gateways", args.sessions
        if sessions < 1:
            raise UsageError("--gateways needs --sessions S >= 1")
    else:
        if args.sessions:
            raise UsageError("--sessions needs --gateways G")
        mode, sessions = "users", args.connections
        if sessions < 1:
            raise UsageError("--connections must be >= 1")
    conns = sessions if mode == "users" else args.gateways
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    per_worker_limit = max(1, min(nofile - 200, 18000))
    workers = args.workers or max(1, math.ceil(conns / MAX_PER_WORKER))
    if mode == "gateways":
        workers = min(workers if args.workers else min(2, args.gateways), args.gateways)
    if workers < 1 or math.ceil(conns / workers) > per_worker_limit:
        raise UsageError(f"{conns} connections over {workers} workers exceeds {per_worker_limit} per process "
                         f"(open-file limit {nofile}): use more --workers")
    n_sources = args.sources or max(2, math.ceil(conns / SOURCES_PER) + 1)
    if not 1 <= n_sources <= 250:
        raise UsageError("--sources must be 1..250")
    return mode, sessions, workers, tuple(f"127.0.0.{2 + k}" for k in range(n_sources))


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    spawn, target, server_argv = _where(args)
    mode, sessions, workers, sources = _sizing(args)
    if args.peer:
        return _peer_scenario(args, _scenario(args, spawn, target, server_argv, mode, sessions, workers, sources))
    return _scenario(args, spawn, target, server_argv, mode, sessions, workers, sources)


def _scenario(args: argparse.Namespace, spawn: bool, target: tuple[str, int] | None, server_argv: list[str],
              mode: str, sessions: int, workers: int, sources: tuple[str, ...]) -> Scenario:
    duration = DEFAULT_DURATION if args.duration is None else args.duration
    tick = args.tick
    spawned_tick = flag_value(server_argv, "--tick")
    if spawn and spawned_tick is not None:
        tick = float(spawned_tick)
    if not tick > 0 or not duration > 0:
        raise UsageError("--tick and --duration must be > 0")
    if not MIN_KEEPALIVE <= args.keepalive <= MAX_KEEPALIVE:
        raise UsageError(f"--keepalive must be {MIN_KEEPALIVE:g}..{MAX_KEEPALIVE:g} s (the wire contract's range)")
    if not 0 <= args.jitter < 0.5:
        raise UsageError("--jitter must be in [0, 0.5): a keepalive later than 1.5x would be a real timeout")
    if args.ping_every is not None and not (mode == "users" and 0.05 <= args.ping_every <= args.keepalive):
        raise UsageError("--ping-every needs user connections and 0.05 <= S <= --keepalive")
    if args.ask_one_in != 1 and not (mode == "users" and 0 <= args.ask_one_in <= 1_000_000):
        raise UsageError("--ask-one-in needs user connections and 0 <= N <= 1000000")
    if not 0.001 <= args.user_tick <= 1.0:
        raise UsageError("--user-tick must be 0.001..1 s")
    if args.late_fraction and not (mode == "users" and 0 < args.late_fraction <= 1 and args.late_by > 0):
        raise UsageError("--late-fraction needs user connections, 0 < F <= 1 and --late-by S > 0")
    devices = args.devices
    if devices != 1:
        if mode != "users" or not 1 <= devices <= 1024 or sessions % devices:
            raise UsageError("--devices needs user connections, 1 <= K <= 1024 and --connections a multiple of K")
        if args.late_fraction:
            raise UsageError("--late-fraction is planned with one device per user only (--devices 1)")
    ramp = args.ramp or (DEFAULT_RAMP_USERS if mode == "users" else DEFAULT_RAMP_GATEWAY_SESSIONS)
    if not ramp > 0:
        raise UsageError("--ramp must be > 0")
    uid_base = args.uid_base
    if uid_base is None:
        # a fresh base per run against a long-lived server: a uid still online from an earlier run would be a
        # duplicate login (no online event) and wreck the matching
        uid_base = 0 if spawn else (int(time.time()) % 1_000_000) * 10_000_000
    if not (0 <= uid_base and uid_base + sessions < 2**63):
        raise UsageError("--uid-base out of range")
    front = _front(args, spawn, server_argv)  # (before server_args is taken: it adds to server_argv)
    sc = Scenario(
        mode=mode, sessions=sessions, gateways=args.gateways, workers=workers, sources=sources, ramp=ramp,
        keepalive=args.keepalive, jitter=args.jitter,
        silent_fraction=_given(args.silent_fraction, 0.01 if args.peer else 0.05),
        bye_fraction=_given(args.bye_fraction, 0.0 if args.peer else 0.01), duration=duration, tick=tick, seed=args.seed, uid_base=uid_base,
        target=target, spawn=spawn, server_args=tuple(server_argv), detector=args.detector,
        server_pid=args.server_pid, metrics_port=args.metrics_port, connect_timeout=args.connect_timeout,
        max_inflight=args.max_inflight, gateway_tick=args.gateway_tick, user_tick=args.user_tick,
        secret_file=args.secret_file,
        server_log=args.server_log, quiet=args.quiet, drain_timeout=args.drain_timeout, ping_every=args.ping_every,
        ask_one_in=args.ask_one_in,
        late_fraction=args.late_fraction, late_by=args.late_by if args.late_fraction else 0.0,
        devices=devices, **front,
    )
    if not (0 <= sc.silent_fraction <= 1 and 0 <= sc.bye_fraction <= 1 and sc.silent_fraction + sc.bye_fraction <= 1):
        raise UsageError("--silent-fraction and --bye-fraction must be in [0, 1] and sum to at most 1")
    if not args.peer:
        try:
            sc.window()
        except ValueError:
            raise UsageError(_too_short(sc)) from None
    return sc


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _peer_scenario(args: argparse.Namespace, sc: Scenario) -> Scenario:
    """--peer mqtt: the idled half of the comparison (the broker's is `_scenarios`'), with the windows of
    `idled.tools.loadtest.peer`; refuses what one of the two peers could not do."""
    if sc.mode != "users" or sc.devices != 1 or sc.late_fraction or sc.tls or sc.websocket or sc.proxy_protocol:
        raise UsageError("--peer drives plain user connections: no --gateways, --devices, --late-fraction, --tls, "
                         "--websocket or --proxy-protocol")
    if args.compare or args.sweep_workers or args.ping_every is not None or args.secret_file:
        raise UsageError("--peer takes neither --compare, --sweep-workers, --ping-every nor --secret-file")
    if sc.keepalive != int(sc.keepalive) or not 1 <= sc.keepalive <= mqtt.MAX_KEEPALIVE:
        raise UsageError(f"--peer: an MQTT keepalive is whole seconds; give --keepalive 1..{mqtt.MAX_KEEPALIVE}, "
                         f"the same for both peers (got {sc.keepalive:g})")
    if not 0 <= args.peer_grace <= 3600:
        raise UsageError("--peer-grace must be 0..3600 s")
    if args.peer_ask_one_in is not None and not 0 <= args.peer_ask_one_in <= 1_000_000:
        raise UsageError("--peer-ask-one-in must be 0..1000000")
    span = peer.silence_span(sc.keepalive)
    mqtt_sc = replace(sc, wire="mqtt")
    start = peer.steady_from(sc.ramp_end, span, max(sc.expected_timeout, mqtt_sc.expected_timeout), args.peer_grace)
    shortest = peer.min_duration(start, sc.tick)
    duration = start + peer.DEFAULT_STEADY if args.duration is None else args.duration
    if duration < shortest:
        raise UsageError(f"--peer: --duration must be at least {math.ceil(shortest)} s (ramp {sc.ramp_end:.1f} s + "
                         f"silent moments {span:g} s + timeout {mqtt_sc.expected_timeout:g} s + grace "
                         f"{args.peer_grace:g} s, then a steady window)")
    server_args = list(sc.server_args)
    if flag_value(server_args, "--workers") is None:
        server_args += ["--workers", "0"]  # one process, as the broker is
    # /metrics is scraped once after the ramp and once after the last sample, never in the steady window: each
    # scrape cost idled ~14 ms of CPU at 19,000 connections (py-spy; ~0.3 % of a core at one per 5 s, 1/7 of its
    # steady CPU at a 20 s keepalive), which the broker would not pay
    out = replace(sc, duration=duration, silence_span=span, steady_from=start, sample_interval=2.0,
                  metrics_interval=math.inf, server_args=tuple(server_args))
    try:  # the same plan for both: the same silent moments (the broker's missed bound is wider)
        same = out.window() == _broker(out, args.peer_grace).window()
    except ValueError:
        same = False
    if not same:
        raise UsageError("--peer: the run is too short for the same silent window against both peers: give a longer "
                         "--duration")
    return out


def _broker(sc: Scenario, grace: float) -> Scenario:
    """The broker's half of --peer: the same scenario, the users speaking MQTT, missed only past timeout + grace."""
    return replace(sc, wire="mqtt", server_args=(), detector=None, bound_ticks=grace / sc.tick)


def _front(args: argparse.Namespace, spawn: bool, server_argv: list[str]) -> dict[str, Any]:
    """The Scenario's TLS / PROXY fields; with --spawn, the server flags they need (added to ``server_argv``)."""
    if args.tls_ca and not args.tls:
        raise UsageError("--tls-ca needs --tls")
    tls_ca = args.tls_ca
    if spawn and args.tls and flag_value(server_argv, "--tls-cert") is None:
        cert, key = _throwaway_certificate()
        server_argv += ["--tls-cert", cert, "--tls-key", key]
        tls_ca = tls_ca or cert  # self-signed: it is its own CA (SAN IP:127.0.0.1)
    if spawn and args.proxy_protocol and "--proxy-protocol" not in server_argv:
        server_argv += ["--proxy-protocol"]
    if args.websocket and args.gateways:
        raise UsageError("--websocket is for user connections (gateways speak TCP)")
    return {"tls": bool(args.tls), "tls_ca": tls_ca, "proxy_protocol": bool(args.proxy_protocol),
            "websocket": bool(args.websocket)}


def _throwaway_certificate() -> tuple[str, str]:
    """A self-signed ECDSA P-256 certificate for 127.0.0.1 in a temporary directory removed at exit."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    openssl = shutil.which("openssl")
    if openssl is None:
        raise UsageError("--tls with --spawn makes a certificate with the openssl binary, which is not installed: "
                         "install it, or give the server --tls-cert/--tls-key (and --tls-ca)")
    directory = tempfile.mkdtemp(prefix="idled-loadtest-tls-")
    atexit.register(shutil.rmtree, directory, True)
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=idled loadtest",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def _too_short(sc: Scenario) -> str:
    """Why the run leaves no room for silent sessions, and the flags that would make room."""
    margin = 0.5 + sc.tick  # stats.silent_window's default
    fixed = sc.ramp_end + sc.bound_ticks * sc.tick + margin
    need = fixed + sc.expected_timeout
    text = (f"the run is too short for silent sessions: --duration must exceed {need:.1f} s "
            f"(ramp {sc.ramp_end:.1f} s + timeout {sc.expected_timeout:g} s = 1.5 x --keepalive {sc.keepalive:g} "
            f"+ {sc.bound_ticks:g} ticks + {margin:.1f} s margin). Give --duration {math.ceil(need) + 1}")
    room = (sc.duration - fixed) / 1.5  # the longest keepalive that fits, exclusive
    if room > MIN_KEEPALIVE:
        keepalive = max(MIN_KEEPALIVE, math.floor(room * 0.9))
        text += f", or a shorter keepalive: --keepalive {keepalive:g}"
    return text + ", or no silent / bye sessions: --silent-fraction 0 --bye-fraction 0"


def check_outputs(args: argparse.Namespace) -> None:
    """Before minutes of load, make sure the results can be written and plotted."""
    if args.json and args.json != "-":
        _check_writable(args.json, "--json")
    if args.plot:
        try:
            importlib.import_module("matplotlib")  # imported, not just found: a broken install fails here too
        except ImportError as exc:
            raise UsageError(f"--plot needs matplotlib ({exc}): pip install matplotlib (the plot extra), or drop --plot") from None
        _check_writable(args.plot, "--plot")
    if args.server_log:
        _check_writable(args.server_log, "--server-log")
    if args.secret_file:
        from idled.protocol.tokens import SecretError, load_secret

        try:
            load_secret(args.secret_file)
        except (OSError, SecretError) as exc:
            raise UsageError(f"--secret-file: {exc}") from None


def _check_writable(path: str, flag: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory")
    if os.path.exists(path):
        ok = os.access(path, os.W_OK)
    else:
        ok = os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK)
    if not ok:
        raise UsageError(f"{flag} {path}: cannot write there")


# -------------------------------------------------------------------------------------------- the run


def exit_status(results: list[dict[str, Any]]) -> int:
    """1 if a run broke off, else 3 if a run FAILED (an event wrong, a login failed, a target missed), else 0."""
    if any(r.get("aborted") for r in results):
        return EXIT_FAILURE
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_TARGET_FAILED


def run(args: argparse.Namespace) -> int:
    try:
        if args.event_rate is not None:
            return _event_rate(args)
        scenarios = _scenarios(args, scenario_from_args(args))
        check_outputs(args)
    except UsageError as exc:
        print(f"idled loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text_out = sys.stderr if args.json == "-" else sys.stdout
    results: list[dict[str, Any]] = []
    try:
        for k, scenario in enumerate(scenarios):
            if k:
                time.sleep(0.5 if args.peer else 2.0)  # let the previous server's sockets settle (--peer: another port)
            results.append(_run_one(scenario, len(scenarios) > 1, text_out))
        if args.peer:
            document = _peer_table(scenarios[0], scenarios[1], results, text_out)
            _write(args, results, document)
        elif args.compare:
            ratios = compare_ratios(results)
            print(compare_text(results, ratios), file=text_out)
            _write(args, results, {"compare": [sc.detector for sc in scenarios], "runs": results, "ratios": ratios})
        elif args.sweep_workers:
            rows = sweep_rows(results)
            print(sweep_table(rows), file=text_out)
            _write(args, results, {"sweep_workers": [r["workers"] for r in rows], "runs": results, "rates": rows})
        else:
            _write(args, results, results[0])
    except KeyboardInterrupt:
        print("idled loadtest: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, ObserverLost, IpcError) as exc:  # RunFailed is a RuntimeError
        # one line, no traceback (a spawned server that failed to start adds its last output lines)
        print(f"idled loadtest: {exc or type(exc).__name__}", file=sys.stderr)
        return EXIT_FAILURE
    return exit_status(results)


def _run_one(scenario: Scenario, several: bool, out: Any) -> dict[str, Any]:
    """One run's result, summarised on ``out``. Of several runs, one that cannot be carried out is kept as
    an aborted result (a dash in the side-by-side table) and the others still run."""
    try:
        result = trio.run(run_scenario, scenario)
    except (RuntimeError, OSError, ObserverLost, IpcError) as exc:
        if not several:
            raise
        why = str(exc) or type(exc).__name__
        print(f"idled loadtest: {why}", file=sys.stderr)
        return {"ok": False, "aborted": why, "detector": scenario.detector, "scenario": scenario.describe()}
    print(summary_text(result), file=out)
    return result


def _scenarios(args: argparse.Namespace, scenario: Scenario) -> list[Scenario]:
    """The runs to make: one, or one per --compare detector, or one per --sweep-workers value, or (--peer) idled
    then the broker, the broker judged with a bound of its timeout + --peer-grace."""
    if args.peer:
        broker = _broker(scenario, args.peer_grace)
        if args.peer_ask_one_in is not None:
            broker = replace(broker, ask_one_in=args.peer_ask_one_in)
        return [scenario, broker]
    if args.compare and args.sweep_workers:
        raise UsageError("give --compare or --sweep-workers, not both")
    if args.sweep_workers:
        try:
            values = [int(v) for v in args.sweep_workers.split(",") if v.strip()]
        except ValueError:
            raise UsageError(f"--sweep-workers takes numbers, e.g. 0,1,2,4; got {args.sweep_workers!r}") from None
        if len(values) < 2 or not all(0 <= v <= MAX_WORKERS for v in values):
            raise UsageError(f"--sweep-workers needs at least two values in 0..{MAX_WORKERS}, e.g. 0,1,2,4")
        base = without_flag(list(scenario.server_args), "--workers")
        return [replace(scenario, server_args=(*base, "--workers", str(v))) for v in values]
    if not args.compare:
        return [scenario]
    detectors = [d.strip() for d in args.compare.split(",") if d.strip()]
    if len(detectors) < 2:
        raise UsageError("--compare needs at least two detectors, e.g. ring,scan,heap")
    return [replace(scenario, detector=detector) for detector in detectors]


def _peer_table(sc: Scenario, broker: Scenario, results: list[dict[str, Any]], out: Any) -> dict[str, Any]:
    """Print the --peer table (both rows, the ratios) and return the JSON document."""
    binary = find_mosquitto()
    names = [f"idled serve {' '.join(without_flag(list(sc.server_args), '--tick')) or ''}".strip(),
             f"mosquitto {mosquitto_version(binary) if binary else '?'}"]
    rows = [peer.peer_row(r, name) for r, name in zip(results, names)]
    ratios = peer.peer_ratios(rows[0], rows[1])
    asks = asks_text(sc.ask_one_in) if broker.ask_one_in == sc.ask_one_in else (
        f"idled: {asks_text(sc.ask_one_in)}; mosquitto: {asks_text(broker.ask_one_in)}")
    title = (f"peer comparison: {sc.sessions:,} connections, keepalive {sc.keepalive:g} s ({asks}), "
             f"{sc.silent_fraction:.1%} silenced, {sc.workers} client processes, steady window from "
             f"{sc.steady_from:.0f} s to {sc.duration:.0f} s; lateness = offline (idled) or close (mosquitto) "
             "- (last send + timeout)")
    print(peer.peer_text(rows, ratios, title), file=out)
    return {"peer": "mqtt", "rows": rows, "ratios": ratios, "runs": results}


def _write(args: argparse.Namespace, results: list[dict[str, Any]], document: dict[str, Any]) -> None:
    if args.json:
        text = json.dumps(clean_json(document), indent=1, default=str, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    if args.plot:
        plot_results([r for r in results if "timeseries" in r], args.plot)  # (not the runs that broke off)


# ---------------------------------------------------------------------------------------- event rate

_EVENT_RATE_FLAGS = ("command", "target", "event_rate", "duration", "secret_file", "quiet")


def _event_rate(args: argparse.Namespace) -> int:
    """`--event-rate RATE --target HOST:PORT [--duration S]`: event -> subscriber latency at a steady rate."""
    from idled.tools.loadtest import eventrate

    defaults = vars(_defaults())
    extra = sorted(f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                   if k not in _EVENT_RATE_FLAGS and v != defaults.get(k))
    if extra:
        raise UsageError(f"--event-rate takes only --target, --duration and --secret-file; drop {', '.join(extra)}")
    if not args.target:
        raise UsageError("--event-rate drives a running server: give --target HOST:PORT")
    host, port = parse_target(args.target)
    seconds = DEFAULT_EVENT_RATE_SECONDS if args.duration is None else args.duration
    if not (args.event_rate > 0 and math.isfinite(args.event_rate)) or not seconds > 0:
        raise UsageError("--event-rate and --duration must be > 0")
    secret = None
    if args.secret_file:
        check_outputs(args)
        from idled.protocol.tokens import load_secret

        secret = load_secret(args.secret_file)
    try:
        latencies = trio.run(eventrate.measure, host, port, args.event_rate, seconds, secret)
    except KeyboardInterrupt:
        print("idled loadtest: interrupted", file=sys.stderr)
        return 130
    except (OSError, eventrate.EventRateError) as exc:
        print(f"idled loadtest: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if not latencies:
        print("idled loadtest: no events received", file=sys.stderr)
        return EXIT_FAILURE
    print(eventrate.summary(latencies, seconds))
    return EXIT_OK


def _defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([])
