"""One load-test scenario: what to run (sessions, rates, plan window, server), fixed before anything starts.

`Scenario` is a frozen value built by the command line (`idled.cli.loadtest`) and read by every part of
the run: the coordinator, the worker configuration, the result document. The helpers below read and edit
the server's own flags (``--tick``, ``--detector``, ...) as a list of strings, because the spawned server
parses them, not us.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from idled.core.timeouts import DEFAULT_MAX_TIMEOUT, DEFAULT_TIMEOUT, KEEPALIVE_FACTOR, timeout_for
from idled.tools.loadtest.stats import silent_window

__all__ = [
    "MAX_PER_WORKER", "SOURCES_PER", "DEFAULT_RAMP_USERS", "DEFAULT_RAMP_GATEWAY_SESSIONS", "Scenario",
    "flag_value", "without_flag",
]

MAX_PER_WORKER: Final = 16000  # connections per worker process (open-file limit here: 20,000, not raisable)
# Connections per loopback source address. All of them go to one destination, so each needs its own source
# port: 28,232 in 32768-60999, but connect() searches the *even* half first (bind() gets the odd one) and,
# once those 14,116 are taken, crawls: measured here at ~700 us of kernel time per connect instead of ~17 us
# (a 100k run with 16.7k per source stalled its workers for seconds). 10,000 stays well inside the even half.
SOURCES_PER: Final = 10000
DEFAULT_RAMP_USERS: Final = 1000.0
DEFAULT_RAMP_GATEWAY_SESSIONS: Final = 10000.0


@dataclass(frozen=True, slots=True)
class Scenario:
    mode: str  # "users" | "gateways"
    sessions: int
    gateways: int
    workers: int
    sources: tuple[str, ...]
    ramp: float
    keepalive: float
    jitter: float
    silent_fraction: float
    bye_fraction: float
    duration: float
    tick: float
    seed: int
    uid_base: int
    target: tuple[str, int] | None
    spawn: bool
    server_args: tuple[str, ...] = ()
    detector: str | None = None
    server_pid: int | None = None
    metrics_port: int | None = None
    connect_timeout: float = 10.0
    max_inflight: int = 500
    gateway_tick: float = 0.05
    user_tick: float = 0.04  # user connections: the engine's timer slot and turn grid
    secret_file: str | None = None
    server_log: str | None = None
    sample_interval: float = 1.0
    metrics_interval: float = 5.0
    progress_interval: float = 1.0
    quiet: bool = False
    bound_ticks: float = 2.0
    drain_timeout: float = 30.0
    tls: bool = False  # connect over TLS (idled.tools.loadtest.connect), trusting tls_ca (None: no verification)
    tls_ca: str | None = None
    proxy_protocol: bool = False  # send a PROXY v2 header first
    websocket: bool = False  # users speak WebSocket (ws://, or wss:// with tls): idled.tools.loadtest.frames
    ping_every: float | None = None  # users: keepalive interval after the ramp (a fixed offered rate)
    ask_one_in: int = 1  # users: one keepalive in N is a ping (answered), the others quiet; 0: none
    late_fraction: float = 0.0  # users: sessions that send one keepalive late_by seconds late
    late_by: float = 0.0
    devices: int = 1  # users: connections per uid (devices "d0".."d{K-1}"); 1 = one plain login per uid
    # --peer mqtt (`idled.tools.loadtest.peer`): what the users speak ("idled" | "mqtt": a Mosquitto is started
    # instead of idled), the silent / bye moments packed into `silence_span` seconds after the ramp, and the
    # steady window's start (seconds after t0: every silent session's close owed by then)
    wire: str = "idled"
    silence_span: float | None = None
    steady_from: float | None = None

    @property
    def front(self) -> dict[str, Any]:
        """What `idled.tools.loadtest.connect.open_from` needs to know: TLS and PROXY (and the user engine,
        WebSocket; the observer stays on TCP)."""
        return {"tls": self.tls, "tls_ca": self.tls_ca, "proxy_protocol": self.proxy_protocol,
                "websocket": self.websocket}

    @property
    def max_timeout(self) -> float:
        """The server's cap on timeouts: a spawned server's ``--max-timeout``, else the default (a ``--target``
        server's own is not known here)."""
        given = flag_value(list(self.server_args), "--max-timeout") if self.spawn else None
        return DEFAULT_MAX_TIMEOUT if given is None else float(given)

    @property
    def expected_timeout(self) -> float:
        """The timeout the server gives each session: its own rule, with its tick and cap (an MQTT broker's:
        1.5 x the keepalive, MQTT-3.1.2-24)."""
        if self.wire == "mqtt":
            return KEEPALIVE_FACTOR * self.keepalive
        return timeout_for(self.keepalive, DEFAULT_TIMEOUT, self.tick, self.max_timeout)

    @property
    def settle(self) -> float:
        """Seconds after the ramp before the keepalive phase is measured (every session on --ping-every)."""
        return 1.0 + (self.ping_every or 0.0)

    @property
    def ramp_end(self) -> float:
        return self.sessions / self.ramp

    def window(self) -> tuple[float, float]:
        """Where silent and bye moments fall; (0, 0) when no session goes silent or says bye."""
        if not (self.silent_fraction or self.bye_fraction or self.late_fraction):
            return (0.0, 0.0)
        start, end = silent_window(duration=self.duration, ramp_end=self.ramp_end, timeout=self.expected_timeout,
                                   tick=self.tick, bound_ticks=self.bound_ticks)
        return (start, min(end, start + self.silence_span)) if self.silence_span else (start, end)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["expected_timeout"] = self.expected_timeout
        d["ramp_end"] = self.ramp_end
        return d


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a server argv (``--flag V`` or ``--flag=V``), None if absent."""
    for k, a in enumerate(argv):
        if a == flag and k + 1 < len(argv):
            return argv[k + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` with every occurrence of ``flag`` and its value removed."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out
