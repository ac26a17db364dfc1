"""`idled status`: what a running daemon holds -- its role, its leader, replication, sessions, connections by role,
next seq, the limits in force, uptime, version.

Read from the daemon's ``GET /status`` on its metrics port (JSON; see `idled.ops.health.Health`), not
through the client protocol. Why: it needs no protocol change (the wire contract every client library
implements stays as it is), it is readable with curl and by monitoring systems the way NATS's ``/varz`` is,
and the metrics port is where an operator already looks. ``--json`` prints the document as the daemon sent it.

With auth on (the daemon has a secret), ``/status`` without a token is redacted -- how the daemon is, not who
is online: no names, no paths (`idled.ops.redact`) -- and the text says so; ``--token`` (an API token from
``idled token --api``) or ``--secret-file`` (one is minted, valid ``TOKEN_TTL`` seconds) reads the whole
document, sent as ``Authorization: Bearer``. A line is printed only for what the document holds.

Every process of a cluster answers: a core (``role`` active, or leader when elected: its standbys and how far
behind each is), a standby or elected follower (``role`` standby: the leader it follows, its link's state and
lag), an edge with a metrics port (``role`` edge: the core it is on and its link). ``up`` is the process's
uptime; a core whose role changed also says for how long it has had this one.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from idled.cli.clientflags import UsageError, endpoint, token_for
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from idled.ops.fdbudget import ConnectionLimit
from idled.ops.logs import plural
from idled.protocol.tokens import API_ROLE

__all__ = ["add_arguments", "run", "fetch_status", "format_status"]

PROG = "idled status"
MAX_DOCUMENT = 1 << 20  # bytes read from /status at most
MISDIRECTED = 421  # the endpoint's answer to a Host that is not an IP address or localhost, with auth off
TOKEN_TTL = 60.0  # seconds an API token minted from --secret-file is valid: this one request
TOKEN_NAME = "idled-status"  # the name it is minted for
REDACTED_NOTE = "redacted         names and paths need an API token: --token TOKEN or --secret-file FILE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics", default="127.0.0.1:9878", metavar="HOST:PORT", type=endpoint,
                        help="the daemon's metrics endpoint (its --metrics-host:--metrics-port; default 127.0.0.1:9878)")
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON document (default off)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="give up after this long (default 5)")
    auth = parser.add_mutually_exclusive_group()
    auth.add_argument("--token", metavar="TOKEN",
                      help="an API token (idled token --api NAME) to read the whole status of a daemon with auth on "
                           "(default none: the redacted one)")
    auth.add_argument("--secret-file", metavar="FILE",
                      help="mint a short-lived API token from the daemon's HMAC secret instead (default none)")


def fetch_status(address: str, timeout: float, token: str | None = None) -> dict[str, Any]:
    """GET http://ADDRESS/status (with ``token`` as ``Authorization: Bearer``); OSError (incl. URLError, and
    HTTPError for a status other than 200) if unreachable, ValueError if not a status."""
    # No proxy: an http_proxy variable must not send a loopback status request elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{address}/status", headers=headers)
    with opener.open(request, timeout=timeout) as response:
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
    """The document as text, one line per thing it holds (a redacted one has fewer, and says so)."""
    connections = doc.get("connections")
    ready = "ready" if doc.get("ready") else f"NOT READY: {doc.get('ready_reason') or 'no reason given'}"
    lines = [f"idled {doc.get('version')}, up {_duration(float(doc.get('uptime_seconds') or 0))}, {ready}"
             + ("; shutting down" if doc.get("stopping") else "")]

    def line(label: str, text: str) -> None:
        lines.append(f"{label:<17}{text}")

    for label, text in _cluster_lines(doc):
        line(label, text)
    if doc.get("sessions_online") is not None:
        users = doc.get("users_online")
        line("sessions online", f"{doc['sessions_online']}" + (f" ({plural(int(users), 'user')})" if users is not None else ""))
    if isinstance(connections, dict):
        line("connections", ", ".join(plural(int(connections.get(role, 0)), role)
                                      for role in ("user", "gateway", "observer", "standby"))
             + f" ({int(connections.get('pending', 0))} logging in)")
        line("gateways", str(int(connections.get("gateway", 0))))
        line("observers", str(int(connections.get("observer", 0))))
        line("standbys", str(int(connections.get("standby", 0))))
    if doc.get("next_seq") is not None:
        line("next seq", str(doc["next_seq"]))
    if doc.get("detector_keys") is not None:
        overflow = doc.get("detector_overflow_keys")
        line("detector keys", f"{doc['detector_keys']}" + (f" ({overflow} in overflow)" if overflow is not None else ""))
    if "ports" in doc:
        line("client ports", ", ".join(str(p) for p in doc.get("ports") or []) or "-")
    if doc.get("data_dir") is not None:
        line("data dir", str(doc["data_dir"]))
    config = doc.get("config")
    if isinstance(config, dict) and config.get("max_connections") is not None:
        effective = int(config["max_connections"])
        limit = ConnectionLimit(int(config.get("max_connections_configured") or effective), effective,
                                config.get("max_connections_why"))
        line("max connections", limit.text(grouped=True))
    lines.extend(_vitals_lines(doc))
    if doc.get("redacted"):
        lines.append(REDACTED_NOTE)
    return "\n".join(lines)


def _cluster_lines(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The role, the leader and replication (see the module docstring), as (label, text)."""
    role = doc.get("role")
    if role is None:
        return []
    since = f" for {_duration(float(doc['role_seconds']))}" if doc.get("role_seconds") is not None else ""
    lines: list[tuple[str, str]] = []
    election = doc.get("election") or {}
    if role == "leader":
        lease = election.get("lease_left")
        lines.append(("role", f"leader{since} (elected" + (f"; lease {float(lease):.1f} s left)" if lease is not None
                                                          else ")")))
    elif role == "standby":
        lines.append(("role", f"standby{since}"))
    elif role == "edge":
        lines.append(("role", f"edge {doc.get('name') or ''}".rstrip()))
    else:
        lines.append(("role", str(role)))
    leader = doc.get("leader")
    if role == "edge":
        lines += _edge_lines(doc.get("edge") or {}, leader)
    elif leader is not None:
        lines.append(("leader", f"{leader} (this core)" if role in ("leader", "active") else str(leader)))
    if isinstance(doc.get("replication"), dict):
        lines.append(("replication", _standbys(doc["replication"])))
    if isinstance(doc.get("standby"), dict):
        lines.append(("replication", _link(doc["standby"])))
    return lines


def _standbys(part: dict[str, Any]) -> str:
    """The active's view: each standby attached, the last seq it synced and how far behind the log it is."""
    durable = part.get("log_durable_seq")
    standbys = part.get("standbys") or []
    each = []
    for standby in standbys:
        acked = int(standby.get("acked") or 0) if standby.get("acked") is not None else -1  # -1: no ack yet
        text = f"{standby.get('name', 'standby')} " + (f"acked seq {acked}" if acked >= 0 else "no ack yet")
        each.append(text + (f" ({max(0, int(durable) - max(acked, 0))} behind)" if durable is not None else ""))
    attached = f"{plural(len(standbys), 'standby', 'standbys')}: {', '.join(each)}" if each else "no standby attached"
    return f"{attached}; sync {'on' if part.get('sync_standby') else 'off'}"


def _link(part: dict[str, Any]) -> str:
    """A standby's view: its link's state, the last seq it holds and how far behind the leader it is."""
    where = f" from {part['active']}" if part.get("active") else ""
    facts = []  # what the document holds (a redacted one has no address; an older one fewer figures)
    if part.get("last_seq") is not None:
        facts.append(f"last seq {part['last_seq']}")
    if part.get("lag_records") is not None:
        lag = f" ({float(part['lag_seconds']):g} s)" if part.get("lag_seconds") is not None else ""
        facts.append(f"{part['lag_records']} records behind{lag}")
    counts = [plural(int(part[key]), word) for key, word in (("reconnects", "reconnect"), ("resyncs", "re-sync"))
              if part.get(key) is not None]
    text = f"{part.get('state') or 'unknown'}{where}" + (f": {', '.join(facts)}" if facts else "")
    text += f"; {', '.join(counts)}" if counts else ""
    return text + (f"; last error: {part['error']}" if part.get("error") else "")


def _edge_lines(part: dict[str, Any], leader: Any) -> list[tuple[str, str]]:
    """An edge's view: the core it is on (or that it has none now), and its users."""
    cores = f"cores {part['cores']}" if part.get("cores") else ""
    if leader is not None:
        lines = [("leader", f"{leader} (core link up" + (f"; {cores})" if cores else ")"))]
    else:
        error = f"; last error: {part['last_error']}" if part.get("last_error") else ""
        lines = [("leader", f"none (core link {part.get('link', 'down')}" + (f"; {cores}" if cores else "") + f"{error})")]
    if part.get("users") is not None:
        lines.append(("users", f"{part['users']} held here ({int(part.get('attaching') or 0)} attaching)"))
    return lines


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


def _refusal(exc: urllib.error.HTTPError) -> str:
    """The daemon's reason for a 401 (its JSON error's message), or its status line."""
    try:
        return str(json.loads(exc.read(MAX_DOCUMENT))["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{exc.code} {exc.reason}"


def run(args: argparse.Namespace) -> int:
    try:
        token = token_for(args, API_ROLE, TOKEN_NAME, ttl=TOKEN_TTL)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        document = fetch_status(args.metrics, args.timeout, token)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            print(f"{PROG}: {args.metrics} refused the token: {_refusal(exc)}", file=sys.stderr)
        elif exc.code == MISDIRECTED:  # auth off: the endpoint answers only an IP address or localhost (Host)
            print(f"{PROG}: {args.metrics} answered {exc.code}: with auth off, give --metrics as an IP address or "
                  "localhost (HOST:PORT), not a DNS name", file=sys.stderr)
        else:
            print(f"{PROG}: {args.metrics}/status answered {exc.code} {exc.reason} (not a core's or an edge's metrics "
                  "port -- idled hook's has none -- or an idled older than /status?)",
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
    page = "" if document.get("role") == "edge" else f"\nstatus page      http://{args.metrics}/"  # an edge's: a note
    print(json.dumps(document, sort_keys=True) if args.json else f"{format_status(document)}{page}")
    return EXIT_OK
