"""`idled status`: what a running daemon holds -- sessions, connections by role, next seq, uptime, version.

Read from the daemon's ``GET /status`` on its metrics port (JSON; see `idled.ops.metrics.Health`), not
through the client protocol. Why: it needs no protocol change (the wire contract every client library
implements stays as it is) and no token, it is readable with curl and by monitoring systems the way NATS's
``/varz`` is, and the metrics port is where an operator already looks (loopback by default, so it exposes
no more than ``/metrics`` does). ``--json`` prints the document as the daemon sent it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from idled.ops.logs import plural

__all__ = ["add_arguments", "run", "fetch_status", "format_status"]

PROG = "idled status"
MAX_DOCUMENT = 1 << 20  # bytes read from /status at most


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics", default="127.0.0.1:9878", metavar="HOST:PORT",
                        help="the daemon's metrics endpoint (its --metrics-host:--metrics-port; default 127.0.0.1:9878)")
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON document (default off)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="give up after this long (default 5)")


def fetch_status(address: str, timeout: float) -> dict[str, Any]:
    """GET http://ADDRESS/status; OSError (incl. URLError) if unreachable, ValueError if not a status."""
    # No proxy: an http_proxy variable must not send a loopback status request elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}/status", timeout=timeout) as response:
        body = response.read(MAX_DOCUMENT)
    document = json.loads(body)
    if not isinstance(document, dict) or "version" not in document:
        raise ValueError("not an idled /status document")
    return document


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def format_status(doc: dict[str, Any]) -> str:
    connections = doc.get("connections") or {}
    ready = "ready" if doc.get("ready") else f"NOT READY: {doc.get('ready_reason')}"
    lines = [
        f"idled {doc.get('version')}, up {_duration(float(doc.get('uptime_seconds', 0)))}, {ready}"
        + ("; shutting down" if doc.get("stopping") else ""),
        f"sessions online  {doc.get('sessions_online')}"
        + (f" ({plural(int(doc['users_online']), 'user')})" if doc.get("users_online") is not None else ""),
        "connections      " + ", ".join(
            plural(int(connections.get(role, 0)), role) for role in ("user", "gateway", "observer", "standby")
        ) + f" ({int(connections.get('pending', 0))} logging in)",
        f"gateways         {int(connections.get('gateway', 0))}",
        f"observers        {int(connections.get('observer', 0))}",
        f"standbys         {int(connections.get('standby', 0))}",
        f"next seq         {doc.get('next_seq')}",
        f"detector keys    {doc.get('detector_keys')} ({doc.get('detector_overflow_keys')} in overflow)",
        f"client ports     {', '.join(str(p) for p in doc.get('ports') or []) or '-'}",
        f"data dir         {doc.get('data_dir')}",
        *_vitals_lines(doc),
    ]
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:g} ms"


def _vitals_lines(doc: dict[str, Any]) -> list[str]:
    """Event rate, lateness percentiles and workers, from daemons that send them (older ones do not)."""
    lines = []
    if doc.get("events_per_second") is not None:
        lines.append(f"events/s         {float(doc['events_per_second']):.2f} (last minute)")
    lateness = doc.get("lateness")
    if lateness:
        lines.append(f"offline lateness p50 {_ms(lateness.get('p50'))}, p90 {_ms(lateness.get('p90'))}, "
                     f"p99 {_ms(lateness.get('p99'))} (at most; {plural(int(lateness.get('count', 0)), 'idle offline')})")
    for worker in doc.get("workers") or []:
        state = f"up, pid {worker.get('pid')}" if worker.get("up") else "DOWN"
        lines.append(f"{worker.get('name')!s:<17}{state}, {plural(int(worker.get('restarts', 0)), 'restart')}, "
                     f"{plural(int(worker.get('sessions', 0)), 'session')}, "
                     f"{plural(int(worker.get('connections', 0)), 'connection')}")
    return lines


def run(args: argparse.Namespace) -> int:
    host, _, port = args.metrics.rpartition(":")
    if not host or not port.isdigit():
        print(f"{PROG}: --metrics must be HOST:PORT, got {args.metrics!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        document = fetch_status(args.metrics, args.timeout)
    except urllib.error.HTTPError as exc:
        print(f"{PROG}: {args.metrics}/status answered {exc.code} {exc.reason} (an idled older than /status?)",
              file=sys.stderr)
        return EXIT_FAILURE
    except (TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        refused = isinstance(reason, ConnectionRefusedError)
        hint = " (is it running? start it with: idled serve)" if refused else ""
        words = reason.strerror if refused and isinstance(reason, OSError) else reason
        print(f"{PROG}: cannot reach the daemon's metrics endpoint {args.metrics}: {words}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    except ValueError as exc:
        print(f"{PROG}: {args.metrics}/status: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(document, sort_keys=True) if args.json else
          f"{format_status(document)}\nstatus page      http://{args.metrics}/")
    return EXIT_OK
