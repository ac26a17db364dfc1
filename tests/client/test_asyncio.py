"""The client library under asyncio, against real `idled serve` subprocesses (scenarios in scenarios.py).

pytest-trio runs `async def` tests under trio, so each test here is synchronous and runs its scenario with
`asyncio.run`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import idled.client.asyncio as lib
from tests.client import scenarios
from tests.client.support import Idled

pytestmark = pytest.mark.slow  # real idled daemons


def test_session_keepalive_and_bye(idled: Idled) -> None:
    asyncio.run(scenarios.session_keepalive_and_bye(lib, asyncio.sleep, idled))


def test_sessions_come_back_after_a_restart(idled: Idled) -> None:
    asyncio.run(scenarios.sessions_come_back_after_a_restart(lib, asyncio.sleep, idled))


def test_gateway_batches_touches(idled: Idled) -> None:
    asyncio.run(scenarios.gateway_batches_touches(lib, asyncio.sleep, idled))


def test_gateway_hears_which_sessions_ended(idled: Idled) -> None:
    asyncio.run(scenarios.gateway_hears_which_sessions_ended(lib, asyncio.sleep, idled))


def test_gateway_answers_marks(idled: Idled) -> None:
    asyncio.run(scenarios.gateway_answers_marks(lib, asyncio.sleep, idled))


def test_observer_resumes_across_restarts(idled: Idled) -> None:
    asyncio.run(scenarios.observer_resumes_across_restarts(lib, asyncio.sleep, idled))


def test_watchlist_observer_watches_and_resumes(idled: Idled) -> None:
    asyncio.run(scenarios.watchlist_observer_watches_and_resumes(lib, asyncio.sleep, idled))


def test_slow_observer_is_cut_with_busy_and_resumes(idled: Idled) -> None:
    asyncio.run(scenarios.slow_observer_is_cut_with_busy_and_resumes(lib, asyncio.sleep, idled))


def test_second_login_kicks_the_first(idled: Idled) -> None:
    asyncio.run(scenarios.second_login_kicks_the_first(lib, asyncio.sleep, idled))


def test_auth_failed_is_final(tmp_path: Path) -> None:
    secret = b"a test secret of at least 16 bytes"
    (tmp_path / "secret").write_bytes(secret)
    daemon = Idled(tmp_path, "--secret-file", str(tmp_path / "secret")).start()
    try:
        asyncio.run(scenarios.auth_failed_is_final(lib, asyncio.sleep, daemon, secret))
    finally:
        daemon.kill()


def test_gone_says_the_oldest_seq(tmp_path: Path) -> None:
    daemon = Idled(tmp_path, "--segment-bytes", "4096", "--retention-bytes", "8192").start()
    try:
        asyncio.run(scenarios.gone_says_the_oldest_seq(lib, asyncio.sleep, daemon))
    finally:
        daemon.kill()


def test_devices_are_sessions_of_one_user(idled: Idled) -> None:
    asyncio.run(scenarios.devices_are_sessions_of_one_user(lib, asyncio.sleep, idled))


def test_gateway_reports_session_keys(idled: Idled) -> None:
    asyncio.run(scenarios.gateway_reports_session_keys(lib, asyncio.sleep, idled))
