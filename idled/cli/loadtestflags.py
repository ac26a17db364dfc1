"""The flags of `idled loadtest`, grouped as ``--help`` shows them: the server under test, the load, the output,
and the event-rate mode.

Only the parser is built here: every check of what was given (each flag against the others, the open-file
limit, the scenario's arithmetic) is `idled.cli.loadtest`'s, where the flags become a `Scenario`. The defaults
that depend on the mode (``--duration``, ``--ramp``) are left None here; the help text names them.
"""

from __future__ import annotations

import argparse

from idled.tools.loadtest.peer import DEFAULT_GRACE, PEERS
from idled.tools.loadtest.scenario import DEFAULT_RAMP_GATEWAY_SESSIONS, DEFAULT_RAMP_USERS, MAX_PER_WORKER

__all__ = ["DEFAULT_DURATION", "DEFAULT_EVENT_RATE_SECONDS", "add_arguments"]

DEFAULT_DURATION = 120.0
DEFAULT_EVENT_RATE_SECONDS = 20.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    _server_flags(parser.add_argument_group("server under test (one of)"))
    _load_flags(parser.add_argument_group("load"))
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the full result (with .hgrm tables) as JSON ('-': stdout)")
    out.add_argument("--plot", metavar="FILE.png", help="plot lateness, connections, CPU and RSS (matplotlib)")
    out.add_argument("--quiet", action="store_true", help="no live progress")
    out.add_argument("--check-targets", action="store_true",
                     help="accepted for old scripts: the sizing targets (RSS/connection, lateness p99) now "
                          "always decide the verdict and the exit status")
    other = parser.add_argument_group("event-rate mode")
    other.add_argument("--event-rate", type=float, metavar="PER_S",
                       help="instead of sessions: with --target, a gateway attaches and detaches fresh uids so the "
                            "server emits PER_S presence events per second for --duration seconds (default "
                            f"{DEFAULT_EVENT_RATE_SECONDS:g} here); prints event -> subscriber latency percentiles")
    parser.add_argument("server_argv", nargs="*", metavar="-- SERVER_ARGS",
                        help="flags passed to `idled serve` (with --spawn / --compare)")


def _server_flags(where: argparse._ArgumentGroup) -> None:
    where.add_argument("--target", metavar="HOST:PORT", help="drive a running server (loopback addresses only)")
    where.add_argument("--spawn", action="store_true",
                       help="start `idled serve` on 127.0.0.1 (port 0) for the run; server flags go after `--`")
    where.add_argument("--server-args", default="", metavar="ARGS",
                       help='extra server flags as one shell-quoted string, e.g. "--max-connections 200000"')
    where.add_argument("--server-pid", type=int, metavar="PID",
                       help="with --target: the server's pid for CPU/RSS (default: found from the port)")
    where.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="with --target: the server's Prometheus port, to read "
                            "idled_event_loop_stall_max_seconds (with --spawn a free port is passed to the server)")
    where.add_argument("--server-log", metavar="FILE", help="with --spawn: write the server's output here")
    where.add_argument("--detector", metavar="NAME", help="with --spawn: passed to the server as --detector")
    where.add_argument("--compare", metavar="D1,D2,...",
                       help="run the scenario once per detector (spawning a server each), e.g. ring,scan,heap")
    where.add_argument("--peer", choices=PEERS,
                       help="run the scenario against a spawned `idled serve` (--workers 0 unless the server flags "
                            "say) and then against a Mosquitto it starts (Debian's /usr/sbin/mosquitto), the users "
                            "speaking MQTT 3.1.1; prints both rows and the ratios (docs/peer.md)")
    where.add_argument("--peer-grace", type=float, default=DEFAULT_GRACE, metavar="S",
                       help=f"with --peer: seconds past its timeout a silent session may be closed before it counts "
                            f"as missed by the broker (MQTT sets no bound; idled keeps its own, 2 ticks); the steady "
                            f"window starts after it (default {DEFAULT_GRACE:g})")
    where.add_argument("--peer-ask-one-in", type=int, metavar="N",
                       help="with --peer: the broker's users' --ask-one-in (default: the same as idled's); 1 is what "
                            "MQTT clients do, a PINGREQ for every keepalive")
    where.add_argument("--sweep-workers", metavar="W1,W2,...",
                       help="run the scenario once per `idled serve --workers` value (spawning a server each), e.g. "
                            "0,1,2,4, and print logins and keepalives per server CPU-second side by side")


def _load_flags(load: argparse._ArgumentGroup) -> None:
    load.add_argument("--connections", type=int, default=1000, metavar="N",
                      help="user connections, one uid each unless --devices (default 1000)")
    load.add_argument("--devices", type=int, default=1, metavar="K",
                      help="user connections: each uid logs in from K connections, devices d0..d{K-1} (N / K users; "
                           "N a multiple of K); events are per user: silent and bye users stop every device, each "
                           "at its own moment, and owe one offline after the last. The server's max_devices must "
                           "be >= K (default 1: one plain login per uid, no device field)")
    load.add_argument("--gateways", type=int, default=0, metavar="G",
                      help="instead of user connections: G gateway connections carrying --sessions in total")
    load.add_argument("--sessions", type=int, default=0, metavar="S", help="sessions carried by the gateways")
    load.add_argument("--ramp", type=float, metavar="PER_S",
                      help=f"new sessions per second (default {DEFAULT_RAMP_USERS:g} connections/s, "
                           f"{DEFAULT_RAMP_GATEWAY_SESSIONS:g} gateway sessions/s)")
    load.add_argument("--keepalive", type=float, default=30.0, metavar="S",
                      help="seconds between keepalives of a session (default 30; server timeout = 1.5x)")
    load.add_argument("--ping-every", type=float, metavar="S",
                      help="user connections: from the end of the login ramp, every session sends a keepalive every "
                           "S seconds (timeouts stay 1.5 x --keepalive): a fixed offered rate, for keepalives per "
                           "CPU-second")
    load.add_argument("--ask-one-in", type=int, default=1, metavar="N",
                      help="user connections: one keepalive in N is a ping, which the server answers, the others "
                           "the quiet keepalive, which asks for no answer (idled: {\"op\":\"msg\"}; MQTT: a "
                           "PUBLISH at QoS 0); the client libraries ask about once every two timeouts. Default 1: "
                           "every keepalive a ping; 0: none")
    load.add_argument("--jitter", type=float, default=0.1, metavar="F",
                      help="each interval is keepalive x U(1-F, 1+F) (default 0.1)")
    load.add_argument("--silent-fraction", type=float, metavar="F",
                      help="fraction of sessions that stop pinging at a recorded moment (default 0.05; 0.01 with "
                           "--peer)")
    load.add_argument("--bye-fraction", type=float, metavar="F",
                      help="fraction of sessions that log out with bye / detach (default 0.01; 0 with --peer)")
    load.add_argument("--late-fraction", type=float, default=0.0, metavar="F",
                      help="user connections: fraction of sessions that send one keepalive --late-by seconds late "
                           "(a lagging client, simulated: past the timeout its offline is right, within it false)")
    load.add_argument("--late-by", type=float, default=0.0, metavar="S",
                      help="with --late-fraction: how late that keepalive is sent, in seconds")
    load.add_argument("--duration", type=float, metavar="S",
                      help=f"length of the measurement from the first connection (default {DEFAULT_DURATION:g}; "
                           "with --peer the steady window's start + 60 s)")
    load.add_argument("--tick", type=float, default=1.0, metavar="S",
                      help="the server's tick: bounds missed offlines (timeout + 2 ticks) and the lateness "
                           "target; passed to a spawned server unless its flags set --tick (default 1.0)")
    load.add_argument("--workers", type=int, metavar="W",
                      help=f"worker processes (default: connections / {MAX_PER_WORKER}, rounded up)")
    load.add_argument("--sources", type=int, metavar="K",
                      help="loopback source addresses 127.0.0.2.. (default: one per 10,000 connections + 1, at least 2)")
    load.add_argument("--seed", type=int, default=1, help="seed of the plan (default 1)")
    load.add_argument("--uid-base", type=int, metavar="N",
                      help="session i has uid N+i, with --devices K N+i//K (default 0 with --spawn, a time-derived base with --target)")
    load.add_argument("--secret-file", metavar="FILE",
                      help="mint login tokens with this secret (server auth on; passed to a spawned server)")
    load.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                      help="seconds each connection may take to connect and log in (default 10)")
    load.add_argument("--max-inflight", type=int, default=500, metavar="N",
                      help="connections being opened at once per worker (default 500)")
    load.add_argument("--gateway-tick", type=float, default=0.05, metavar="S",
                      help="a gateway batches its touches into slots of this many seconds (default 0.05)")
    load.add_argument("--user-tick", type=float, default=0.04, metavar="S",
                      help="user connections: each worker's timer slot and loop turn, in seconds (default 0.04); "
                           "smaller sends keepalives more evenly, at more generator CPU")
    load.add_argument("--tls", action="store_true",
                      help="connect over TLS (with --spawn: the server gets a throw-away self-signed P-256 "
                           "certificate made with openssl, unless the server flags give --tls-cert)")
    load.add_argument("--tls-ca", metavar="FILE",
                      help="with --tls: verify the server against this CA (default: no verification)")
    load.add_argument("--proxy-protocol", action="store_true",
                      help="send a PROXY v2 header naming the connection's own address first (with --spawn: "
                           "the server gets --proxy-protocol)")
    load.add_argument("--websocket", action="store_true",
                      help="users connect over WebSocket (ws://; wss:// with --tls) on the same port, each frame a "
                           "binary message; the observer stays on TCP (docs/protocol.md#websocket)")
    load.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                      help="at the end, how long the observer may take to catch up with the server's events "
                           "(sessions keep pinging meanwhile; default 30)")
