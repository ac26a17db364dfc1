"""The client library under trio, against real `idled serve` subprocesses (scenarios in scenarios.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import idled.client.trio as lib
from tests.client import scenarios
from tests.client.support import Idled

pytestmark = pytest.mark.slow  # real idled daemons


async def test_session_keepalive_and_bye(idled: Idled) -> None:
    await scenarios.session_keepalive_and_bye(lib, trio.sleep, idled)


async def test_sessions_come_back_after_a_restart(idled: Idled) -> None:
    await scenarios.sessions_come_back_after_a_restart(lib, trio.sleep, idled)


async def test_gateway_batches_touches(idled: Idled) -> None:
    await scenarios.gateway_batches_touches(lib, trio.sleep, idled)


async def test_gateway_hears_which_sessions_ended(idled: Idled) -> None:
    await scenarios.gateway_hears_which_sessions_ended(lib, trio.sleep, idled)


async def test_gateway_answers_marks(idled: Idled) -> None:
    await scenarios.gateway_answers_marks(lib, trio.sleep, idled)


async def test_observer_resumes_across_restarts(idled: Idled) -> None:
    await scenarios.observer_resumes_across_restarts(lib, trio.sleep, idled)


async def test_watchlist_observer_watches_and_resumes(idled: Idled) -> None:
    await scenarios.watchlist_observer_watches_and_resumes(lib, trio.sleep, idled)


async def test_slow_observer_is_cut_with_busy_and_resumes(idled: Idled) -> None:
    await scenarios.slow_observer_is_cut_with_busy_and_resumes(lib, trio.sleep, idled)


async def test_second_login_kicks_the_first(idled: Idled) -> None:
    await scenarios.second_login_kicks_the_first(lib, trio.sleep, idled)


async def test_auth_failed_is_final(tmp_path: Path) -> None:
    secret = b"a test secret of at least 16 bytes"
    (tmp_path / "secret").write_bytes(secret)
    daemon = Idled(tmp_path, "--secret-file", str(tmp_path / "secret")).start()
    try:
        await scenarios.auth_failed_is_final(lib, trio.sleep, daemon, secret)
    finally:
        daemon.kill()


async def test_gone_says_the_oldest_seq(tmp_path: Path) -> None:
    daemon = Idled(tmp_path, "--segment-bytes", "4096", "--retention-bytes", "8192").start()
    try:
        await scenarios.gone_says_the_oldest_seq(lib, trio.sleep, daemon)
    finally:
        daemon.kill()


async def test_devices_are_sessions_of_one_user(idled: Idled) -> None:
    await scenarios.devices_are_sessions_of_one_user(lib, trio.sleep, idled)


async def test_gateway_reports_session_keys(idled: Idled) -> None:
    await scenarios.gateway_reports_session_keys(lib, trio.sleep, idled)
