"""One address, one meaning: every place an operator types a core's ``HOST:PORT`` reads it the same way.

The same text goes to each caller's real entry point -- a CLI tool's ``--core`` (argparse, then the client
link it connects with), the edge's ``--core`` (its link to the core), ``--standby-of`` (the configuration, then
the standby's target), ``--advertise`` (the configuration, then what a client makes of it as a ``not_leader``
hint) and an ``--election`` endpoint -- and every one either refuses it or reads the same (host, port).
The grammar itself is tested in tests/protocol/test_address.py; this is its callers agreeing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from idled.cli.main import build_parser
from idled.client.errors import NotLeader
from idled.client.link import Link
from idled.client.trio import TRIO
from idled.ops import config as config_module
from idled.protocol import Login
from idled.server.edge.link import CoreLink
from idled.server.election import parse_election_url
from idled.server.standby import StandbyServer

Outcome = tuple[str, int] | str | None  # None: refused; a str: taken, then unusable (what happened)

# Written with a port (each caller's default port, where it has one, is another matter: see the grammar's tests).
TEXTS = [
    "127.0.0.1:7878", "[::1]:7878", "core-1.example.org:7000", "localhost:1",
    "::1:7878",  # unbracketed IPv6 with a port: ambiguous (::1 port 7878, or the address ::1:7878)
    "[nope]:7878", "[127.0.0.1]:7878", "[::1]x", "[::1]:", "[::1", "::1]:7878",
    "bad host:7878", "bad_host!:7878", "-lead.example:7878", "a..b:7878", "1.2.3.4.5:7878", "256.0.0.1:7878",
    "127.1:7878", "h:0", "h:65536", "h:+1", "h: 1", "h:\u0663", "h:99999999999", ":7878", "h:", "",
]


def _serve_args(*argv: str) -> argparse.Namespace:
    return build_parser("serve").parse_args(["serve", *argv])


def via_cli_core(text: str) -> Outcome:
    """``idled watch --core=TEXT``: refused at parse (exit 2), else the core its client link dials."""
    try:
        args = build_parser("watch").parse_args(["watch", f"--core={text}"])
    except SystemExit as exc:
        assert exc.code == 2
        return None
    link = Link(TRIO, args.host, args.port, Login("observer", "t"))
    (member,) = link.cores.members
    return (member[0], member[1])


def via_edge_core(text: str) -> Outcome:
    """``idled edge --core TEXT``: the core its link dials."""
    try:
        link = CoreLink(text, "edge-t", secret=None, on_ended=lambda *_: None)
    except ValueError:
        return None
    (member,) = link.cores.members
    return (str(member[0]), int(member[1]))


def via_standby_of(text: str, data_dir: Path) -> Outcome:
    """``idled serve --standby-of TEXT``: refused by the configuration, else the active its standby follows."""
    try:
        cfg = config_module.load(_serve_args(f"--standby-of={text}", "--data-dir", str(data_dir), "--metrics-port", "0"), env={})
    except config_module.ConfigError:
        return None
    host, port = StandbyServer(cfg, env={}).active
    return (host, port)


def via_advertise(text: str) -> Outcome:
    """``idled serve --election ... --advertise TEXT``: refused by the configuration, else where a client sent
    there by a ``not_leader`` naming it goes."""
    try:
        config_module.load(_serve_args("--election", "etcd://127.0.0.1:2379/idled", f"--advertise={text}"), env={})
    except config_module.ConfigError:
        return None
    link = Link(TRIO, "127.0.0.1:7878", None, Login("observer", "t"))
    hint = link._hint(NotLeader("not_leader", "elsewhere", text))
    if hint is None:
        return "taken by the configuration, unreadable to a client"
    return (hint[0], hint[1])


def via_election(text: str) -> Outcome:
    """``--election etcd://TEXT/idled``: the etcd endpoint (the same grammar, etcd's default port)."""
    try:
        (endpoint,) = parse_election_url(f"etcd://{text}/idled").endpoints
    except ValueError:
        return None
    return endpoint


@pytest.mark.parametrize("text", TEXTS)
def test_every_caller_reads_an_address_the_same_way(text: str, tmp_path: Path) -> None:
    outcomes = {
        "--core of a CLI tool": via_cli_core(text),
        "--core of the edge": via_edge_core(text),
        "--standby-of": via_standby_of(text, tmp_path),
        "--advertise": via_advertise(text),
        "--election endpoint": via_election(text),
    }
    assert len(set(outcomes.values())) == 1, f"{text!r} read differently: {outcomes}"


def test_only_the_edge_takes_a_unix_socket_and_every_other_caller_refuses_it(tmp_path: Path) -> None:
    text = f"unix:{tmp_path}/core.sock"
    link = CoreLink(text, "edge-t", secret=None, on_ended=lambda *_: None)
    assert link.address == text
    assert via_cli_core(text) is None
    assert via_standby_of(text, tmp_path) is None
    assert via_advertise(text) is None


@pytest.mark.parametrize(("argv", "names"), [
    (["watch", "--core=::1:7878"], "argument --host/--core: bad address '::1:7878'"),
    (["query", "--core=127.0.0.1:7878,,b:1", "u"], "argument --host/--core: bad address"),
    (["edge", "--core=::1:7878"], "configuration: --core: bad address '::1:7878'"),
    (["check-config", "--standby-of=::1:7878"], "configuration: standby_of: bad address '::1:7878'"),
    (["check-config", "--election=etcd://127.0.0.1:2379/x", "--advertise=[::1]"], "advertise: bad address '[::1]'"),
    (["status", "--metrics=::1:9878"], "argument --metrics: bad address '::1:9878'"),
    (["promote", "--data-dir=.", "--metrics=h:0"], "argument --metrics: bad address 'h:0'"),
    (["loadtest", "--target=127.0.0.1:0"], "--target: bad address '127.0.0.1:0'"),
])
def test_a_refused_address_is_one_line_naming_the_setting_and_exit_status_2(
        argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    from idled.cli.main import main

    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage error
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2, err
    assert names in err and "(expected " in err and err.count("\n") == 1, err
