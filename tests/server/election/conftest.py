"""Fixtures: a real etcd per module (tests use prefixes of their own), and a factory for one of a test's own
(a test that kills it)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idled.tools.etcd import ETCD, EtcdServer

_prefixes = itertools.count(1)


def _require_etcd() -> None:
    if ETCD is None:
        pytest.skip("etcd not found on PATH (Debian: apt-get install etcd-server; see .ci/system-deps)")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    _require_etcd()
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    _require_etcd()
    started: list[EtcdServer] = []

    def start() -> EtcdServer:
        server = EtcdServer(tmp_path / f"etcd{len(started)}")
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.kill()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test of the module uses."""
    return f"idled-test/{next(_prefixes)}"
