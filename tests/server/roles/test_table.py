"""idled.server.roles.table and idled.server.runtime.reload: what the core and an edge share -- reload, the connection limit, the role table --
and the doorway's explicit TLS reload. Real sockets (the sd_notify datagrams), real certificate files, a real
SIGHUP to an in-process core."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from idled.door.door import client_gate
from idled.ops.config import Config, ConfigError
from idled.ops.fdbudget import RESERVE, Budget
from idled.ops.metrics import ROLES as METRIC_ROLES, Metrics
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import ROLES
from idled.server import app
from idled.server.edge import app as edge_app
from idled.server.roles import table
from idled.server.roles.doorway import ROLE_LABELS, Doorway
from idled.server.roles.users import run_user
from idled.server.runtime.reload import reload
from tests.tlscerts import Certs

log = logging.getLogger("tests.lifecycle")


class _Source:
    """A configuration source for ``reload``: hands out ``config`` (or raises ``error``), counting calls."""

    def __init__(self, config: Config | None = None, error: ConfigError | None = None) -> None:
        self.config, self.error, self.calls = config, error, 0

    def __call__(self) -> Config:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.config is not None
        return self.config


def test_counts_and_roles_cover_every_login_role() -> None:
    assert table.connection_counts() == {"user": 0, "gateway": 0, "observer": 0, "standby": 0, "pending": 0}

    async def gateway(*_: object) -> None:
        return None

    async def observer(*_: object) -> None:
        return None

    async def standby(*_: object) -> None:
        return None

    users: Any = object()  # stands for a UserSink: the table only binds it
    doorway_roles = table.roles(users, gateway=gateway, observer=observer, standby=standby)
    assert set(doorway_roles) == set(ROLE_LABELS) == set(ROLES)
    uid: Any = doorway_roles["uid"]
    assert uid.func is run_user and uid.args == (users,)
    assert doorway_roles["gateway"] is gateway and doorway_roles["observer"] is observer and doorway_roles["standby"] is standby
    # Every label a connection can be counted under is a metrics label too (idled_connections{role}).
    assert set(table.connection_counts()) == set(METRIC_ROLES)


def test_connection_limit_is_capped_to_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    budget = Budget.of(1000, listeners=2)
    assert budget.connections == 1000 - RESERVE - 2
    with caplog.at_level(logging.INFO, logger=log.name):
        assert table.connection_limit(100, budget, log) == 100
        assert table.connection_limit(100, None, log) == 100  # no budget known yet: as configured
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert table.connection_limit(5000, budget, log) == budget.connections
        [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
        expected = f"max_connections 5000 is more than the descriptors allow ({budget}): capped to 934"
        assert warning.getMessage() == expected
        caplog.clear()
        # --workers: the daemon-wide max_connections is checked elsewhere; this edge's own limit is its budget.
        assert table.connection_limit(5000, budget, log, shared=True) == budget.connections
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _notify_socket(tmp_path: Path) -> tuple[socket.socket, dict[str, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.setblocking(False)
    return sock, {"NOTIFY_SOCKET": path}


def _datagrams(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


def test_reload_applies_the_reloadable_and_names_the_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    current = Config()
    new = dataclasses.replace(current, max_connections=7, login_timeout=9.0, port=1234, tick=0.5)
    applied: list[Config] = []
    sock, env = _notify_socket(tmp_path)
    root = logging.getLogger()
    level = root.level
    try:
        with caplog.at_level(logging.INFO, logger=log.name):
            reload(current, _Source(dataclasses.replace(new, log_level="debug")),
                             table.DOOR_RELOADABLE, applied.append, log, env=env)
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(level)
        sock.close()
    [config] = applied
    # what can change now changed; what needs a restart kept its running value
    assert (config.max_connections, config.login_timeout, config.log_level) == (7, 9.0, "debug")
    assert (config.port, config.tick) == (current.port, current.tick)
    line = "SIGHUP: reloaded log_level=debug, max_connections=7, login_timeout=9.0; needs a restart: port, tick"
    assert line in caplog.text


def test_reload_tells_systemd_and_a_bad_configuration_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock, env = _notify_socket(tmp_path)
    applied: list[Config] = []
    try:
        source = _Source(error=ConfigError("max_timeout is at most ten days"))
        with caplog.at_level(logging.INFO, logger=log.name):
            reload(Config(), source, table.DOOR_RELOADABLE, applied.append, log, env=env)
        assert source.calls == 1 and applied == []
        assert "SIGHUP: configuration not reloaded: max_timeout is at most ten days" in caplog.text
        # RELOADING=1 while reading, READY=1 after it -- also when it failed
        assert _datagrams(sock) == [b"RELOADING=1", b"READY=1"]
        # no environment given (an edge: its supervisor speaks to systemd): nothing sent
        reload(Config(), _Source(Config()), table.DOOR_RELOADABLE, applied.append, log)
        assert _datagrams(sock) == [] and applied == [Config()]
    finally:
        sock.close()


def test_reload_without_a_source_says_so(caplog: pytest.LogCaptureFixture) -> None:
    applied: list[Config] = []
    with caplog.at_level(logging.INFO, logger=log.name):
        reload(Config(), None, table.DOOR_RELOADABLE, applied.append, log)
    assert applied == [] and "SIGHUP: no configuration source to reload" in caplog.text


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def test_tls_certificates_are_reloaded_by_reload_not_by_assigning_config(tmp_path: Path, certs: Certs) -> None:
    cert, key = certs.server("first")
    live_cert, live_key = tmp_path / "cert.pem", tmp_path / "key.pem"
    live_cert.write_bytes(cert.read_bytes())
    live_key.write_bytes(key.read_bytes())
    config = Config(tls_cert=str(live_cert), tls_key=str(live_key))
    door = Doorway(config, sessions=_Open(), roles={}, secret=None, metrics=NullMetrics(),
                   connections=table.connection_counts(), gate=client_gate(config))
    front = door.gate.front
    assert front is not None
    first = front.context
    cert2, key2 = certs.server("second")
    live_cert.write_bytes(cert2.read_bytes())
    live_key.write_bytes(key2.read_bytes())
    door.config = dataclasses.replace(config, login_timeout=2.0)  # a plain assignment: no file is read
    assert front.context is first
    new = dataclasses.replace(config, login_timeout=3.0)
    table.reload_door(door, config, new, limit=lambda n: n // 2)
    assert door.config is new and front.context is not first
    assert door.limit == config.max_connections  # max_connections did not change: the limit stays
    table.reload_door(door, new, dataclasses.replace(new, max_connections=10), limit=lambda n: n // 2)
    assert door.limit == 5


class _Open:
    """The doorway's ``Admission``: not stopping."""

    stopping = False

    def refuse_if_stopping(self) -> None:
        pass


async def test_sighup_reloads_a_running_core(tmp_path: Path) -> None:
    config = Config(port=0, metrics_port=0, tick=0.1, fsync="never", data_dir=str(tmp_path / "data"),
                    max_connections=1000)
    source = _Source(dataclasses.replace(config, max_connections=77, max_gateway_frame=1 << 16, tick=0.2))
    server = app.Server(config, metrics=Metrics(CollectorRegistry(), tick=0.1, process_collectors=False), env={},
                        reload_config=source)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, [])
            door = server.running.doorway
            assert door is not None and door.limit == config.max_connections
            os.kill(os.getpid(), signal.SIGHUP)
            while source.calls == 0:
                await trio.sleep(0.01)
            assert door.limit == 77 and door.config.max_connections == 77
            assert server.config.max_gateway_frame == 1 << 16 and server.config.tick == 0.1  # tick: a restart
            server.stop()
    assert server.stopped.is_set()


def test_an_edge_reloads_its_doorway_as_the_core_does(tmp_path: Path) -> None:
    config = Config(max_connections=100)
    source = _Source(dataclasses.replace(config, max_connections=50, max_frame=8192, timeout=60.0))
    edge = edge_app.Edge(config, core="127.0.0.1:9", name="edge-test", reload_config=source)
    assert edge.doorway.limit == 100 and edge_app.RELOADABLE == table.DOOR_RELOADABLE
    edge._reload()
    assert edge.doorway.limit == 50 and edge.doorway.config is edge.config
    assert (edge.config.max_frame, edge.config.timeout) == (8192, config.timeout)  # timeout needs a restart


def test_a_reload_applies_the_websocket_origins() -> None:
    """``ws_origins`` is read per reload, on the core and an edge alike (SIGHUP: no restart to allow a page)."""
    assert "ws_origins" in table.DOOR_RELOADABLE
    config = Config()
    door = Doorway(config, sessions=_Open(), roles={}, secret=None, metrics=NullMetrics(),
                   connections=table.connection_counts(), gate=client_gate(config))
    assert door.origins.origins == frozenset()
    table.reload_door(door, config, dataclasses.replace(config, ws_origins="https://app.example/, null"),
                      limit=lambda n: n)
    assert door.origins.origins == {"https://app.example", "null"}
