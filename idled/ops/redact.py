"""What the metrics port tells a client without the API token: how the daemon is, not who is online.

Theory of operation
-------------------
With auth on (a secret configured), ``GET /status`` without a token answers ``redact_status(document)``: the
status document cut down to an **allowlist** (``ALLOWED``) of fields that describe the daemon -- its version,
readiness, counts, rates, lateness, configuration summary, role -- and nothing that names a user, a peer or a
file: no uid, no event, no gateway or standby name, no address of another machine, no path. A field is kept
only if the list names it, so a field added to the document later stays out of the unauthenticated answer
until someone decides it may go in (the safe default for a list of what may leak is "nothing"). The document
says so: ``"redacted": true``.

Free text that may carry a path (the readiness reason, a standby's last error, whoever produced it) goes
through ``scrub_paths``: the paths the caller knows (the data directory, as configured and resolved) become
``<data dir>`` (a file in it ``<data dir>/00000001.seg``), and anything else that looks like an absolute path (``/`` after a blank, a quote, a bracket or
``=``, followed by more than itself) becomes ``<path>``, and a network address (an IPv4 address with or
without its port, an IPv6 one bracketed or not, a name with a port: the active a standby cannot reach; a
dotted name in quotes: the host a certificate is not valid for) becomes ``<address>``. The operating system's words (``No space left on device``) stay: they say what is wrong
without saying where.

Pure: data in, data out; ``idled.ops.health`` decides who gets which.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["ALLOWED", "KEEP", "SCRUB", "redact_status", "scrub_paths"]

KEEP: Final = "keep"  # the value as it is (a number, a flag, or a mapping of fixed names to numbers)
SCRUB: Final = "scrub"  # free text: kept with its paths replaced (``scrub_paths``)

# field -> KEEP, SCRUB, a nested allowlist (a mapping), or a one-element list: a list of such mappings.
ALLOWED: Final[Mapping[str, Any]] = {
    # Health's own part (idled.ops.health)
    "version": KEEP, "uptime_seconds": KEEP, "role_seconds": KEEP, "ready": KEEP, "ready_reason": SCRUB,
    # the server's scrape-time sizes (Server.snapshot); gateway_watermark_lag is by gateway name: left out
    "connections": KEEP, "sessions_online": KEEP, "users_online": KEEP, "detector_keys": KEEP,
    "detector_overflow_keys": KEEP, "observer_queued_bytes": KEEP, "eventlog_damaged_bytes": KEEP,
    "eventlog_damaged_records": KEEP, "eventlog_rolls_deferred": KEEP, "sessions_held": KEEP, "wall_clock_ahead": KEEP,
    "eventlog_degraded": KEEP, "eventlog_held_events": KEEP, "events_held": KEEP, "degraded": SCRUB,
    # Server.status / StandbyServer.status / Edge.status; data_dir is a path, leader an address: left out
    "next_seq": KEEP, "ports": KEEP, "stopping": KEEP, "role": KEEP,
    "replication": {"sync_standby": KEEP, "sync_attached": KEEP, "durable_seq": KEEP, "log_durable_seq": KEEP,
                    "records_sent": KEEP, "standbys": [{"acked": KEEP, "sent": KEEP, "sync": KEEP}]},
    # idled.server.status.overview.status_part: the config summary holds settings only (no path, no secret)
    "config": KEEP, "events_per_second": KEEP, "lateness": KEEP,
    "workers": [{"name": KEEP, "pid": KEEP, "up": KEEP, "restarts": KEEP, "sessions": KEEP, "connections": KEEP}],
    "election": {"lease_left": KEEP},  # not the etcd target nor the advertised address
    # a standby's link (idled.server.ha.follow.Link.status): not the active's address
    "standby": {"state": KEEP, "connected": KEEP, "last_seq": KEEP, "active_durable_seq": KEEP, "lag_records": KEEP,
                "lag_seconds": KEEP, "records": KEEP, "resyncs": KEEP, "reconnects": KEEP, "synced": KEEP,
                "error": SCRUB, "tls": KEEP},
    # an edge's link (idled.server.edge.app.Edge.status): not the cores' addresses, nor the edge's name
    "edge": {"link": KEEP, "logins": KEEP, "users": KEEP, "attaching": KEEP, "last_error": SCRUB},
}

_DATA_DIR: Final = "<data dir>"
_PATH_RE: Final = re.compile(r"""(?:^|(?<=[\s'"(\[=]))(?:~|\.\.?)?/[^\s'"()\[\],;]+""")
# Another machine's address in an error text ("cannot connect to 10.0.0.1:7878", "[2001:db8::1]:7878",
# "core-b.internal:7878"): an IPv4 address (with its port, if any), a bracketed IPv6 one, a name with a port;
# an unbracketed IPv6 one ("('::1', 7878, 0, 0)": compressed, or all eight groups, so that a time such as
# 12:30:45 is not one); and a dotted name in quotes, as TLS names the host a certificate is not valid for.
_ADDRESS_RE: Final = re.compile(
    r"(?<![\w.:-])(?:\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?|\[[0-9A-Fa-f:.%\w]+\](?::\d{1,5})?"
    r"|(?=[\w.-]*[A-Za-z])[A-Za-z0-9](?:[\w-]*\.)*[\w-]+:\d{1,5}"
    r"|(?=[0-9A-Fa-f:]*::)[0-9A-Fa-f:]*[0-9A-Fa-f:](?:\d{1,3}(?:\.\d{1,3}){3})?(?:%\w+)?"
    r"|(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?:%\w+)?"
    r"|(?<=')(?=[\w.-]*\.[A-Za-z])[A-Za-z0-9][\w-]*(?:\.[\w-]+)+(?='))(?![\w.])")


def scrub_paths(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with the ``known`` paths (the data directory), anything that looks like an absolute path, and
    any network address replaced (see the module docstring)."""
    paths = sorted({p.rstrip("/") for p in known if p.strip("/")}, key=len, reverse=True)
    if paths:  # one pass, longest first, whole paths only: "data" must not eat the "data" in "metadata"
        alternatives = "|".join(re.escape(path) for path in paths)
        text = re.sub(rf"(?<![\w./-])(?:{alternatives})(?![\w.-])", _DATA_DIR, text)
    return _ADDRESS_RE.sub("<address>", _PATH_RE.sub("<path>", text))


def redact_status(document: Mapping[str, Any], known: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of ``document`` that ``ALLOWED`` names, free text scrubbed, and ``"redacted": True``."""
    known = tuple(known)
    kept = _pick(document, ALLOWED, known)
    kept["redacted"] = True
    return kept


def _pick(document: Mapping[str, Any], allowed: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in document.items():
        rule = allowed.get(key)
        if rule is None:
            continue
        if rule == KEEP:
            kept[key] = value
        elif rule == SCRUB:
            kept[key] = scrub_paths(value, known) if isinstance(value, str) else value
        elif isinstance(rule, list):
            kept[key] = None if value is None else [_pick(item, rule[0], known) for item in value
                                                    if isinstance(item, Mapping)]
        else:
            kept[key] = _pick(value, rule, known) if isinstance(value, Mapping) else None
    return kept
