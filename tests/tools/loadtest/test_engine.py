"""The user engine: against an in-process peer on loopback (real sockets, one trio loop), and end to end
against a spawned `idled serve` (slow). Nothing here asserts a CPU figure: the generator's own measurements
are checked for presence and consistency only."""

from __future__ import annotations

import functools
import json
import math
import subprocess
from collections import Counter
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.protocol import (
    PING, PONG_FRAME, QUIET, Error, ErrorCode, FrameDecoder, Login, Welcome, encode, receive_message,
)
from idled.tools.loadtest.engine import Engine
from idled.tools.loadtest.frames import login_frame, login_templates
from idled.tools.loadtest.workerstate import Worker

# ------------------------------------------------------------------------------- against an in-process peer


def _worker(port: int, sessions: int, **extra: Any) -> Worker:
    cfg = {"worker": 0, "workers": 1, "mode": "users", "host": "127.0.0.1", "port": port,
           "sources": ["127.0.0.2", "127.0.0.3"], "uid_base": 1000, "sessions": sessions, "keepalive": 1.0,
           "jitter": 0.1, "ramp": 200.0, "connect_timeout": 5.0, "plan": [], "max_inflight": 50, **extra}
    return Worker(cfg)


async def _peer(stream: trio.SocketStream, kill_uid: int | None, welcome_timeout: float,
                seen: Counter[str] | None = None) -> None:
    """A minimal server: welcome (with a pong glued behind it), a pong per ping; `kill_uid` is sent
    ``idle_timeout`` and closed after its first ping. ``seen`` counts the pings and quiet keepalives."""
    decoder = FrameDecoder()
    uid = None
    try:
        while (msg := await receive_message(stream, decoder)) is not None:
            if seen is not None:
                seen["ping" if msg is PING else "quiet" if msg is QUIET else "other"] += 1
            if type(msg) is Login:
                uid = msg.name
                await stream.send_all(encode(Welcome("uid", uid, timeout=welcome_timeout)) + PONG_FRAME)
            elif msg is PING:
                if uid == kill_uid:
                    await stream.send_all(encode(Error(ErrorCode.IDLE_TIMEOUT, "test")))
                    return
                await stream.send_all(PONG_FRAME)
    except trio.BrokenResourceError:
        pass
    finally:
        await stream.aclose()


async def _run_engine(w: Worker, kill_uid: int | None, max_seconds: float,
                      seen: Counter[str] | None = None) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"),
                                        lambda s: _peer(s, kill_uid, 1.5, seen), 0)
        w.cfg["port"] = w.port = listeners[0].socket.getsockname()[1]
        w.max_seconds = max_seconds
        w.t0 = trio.current_time() + 0.05
        await Engine(w).run()
        nursery.cancel_scope.cancel()


async def test_the_engine_logs_in_pings_records_closes_and_stops_by_itself() -> None:
    w = _worker(0, 30)
    await _run_engine(w, kill_uid=1007, max_seconds=2.5)
    assert w.logged_in == 30 and w.failed_records == [] and w.connect_hist.count == 30
    assert w.login_hist.count == 30 and 0 <= w.login_hist.min <= w.login_hist.max < 2.0
    assert w.pings > 30  # ~2 s of 1 s keepalives, minus the phase and the one killed after its first
    assert w.pongs >= w.pings - 30  # one pong per ping (the last ones may be in flight) + the glued ones
    assert w.errors["engine:max_seconds"] == 1  # it stopped at its own bound
    assert w.errors["session:server:idle_timeout"] == 1
    (index, prev, last, at, how), = w.closed_records
    assert (index, how) == (7, "server:idle_timeout")
    assert 0 < prev <= last <= at  # login then the first keepalive, both before the close
    assert w.conns == 0 and w.pinging == 0 and w.ended == 1
    assert w.lag_hist.count == w.pings and w.turn_hist.count > 0
    assert set(w.marks) == {"ramp", "stop"}  # (the worker process adds "start")
    assert w.ramp_done


@pytest.mark.parametrize("one_in", [3, 0])
async def test_ask_one_in_n_keepalives_is_a_ping_the_others_are_quiet(one_in: int) -> None:
    w, seen = _worker(0, 30, ask_one_in=one_in), Counter[str]()
    await _run_engine(w, kill_uid=None, max_seconds=2.5, seen=seen)
    assert seen["other"] == 30 and w.pings > 30  # the logins; ~2 s of 1 s keepalives
    got = seen["ping"] + seen["quiet"]
    lost = w.pings - got  # sent as the engine stopped, never read by the peer (cancelled with it)
    assert 0 <= lost <= 30
    if one_in:  # the engine's count is over all its sessions: one in N exactly, give or take the lost
        assert abs(seen["ping"] - got / one_in) <= 1 + lost, (seen, w.pings)
    else:
        assert seen["ping"] == 0
    # an answer to pings only (and, at most, the 30 glued to the welcomes)
    assert seen["ping"] - lost <= w.pongs <= 30 + seen["ping"], (w.pongs, seen)


async def test_a_planned_late_session_delays_one_keepalive_and_says_so() -> None:
    w = _worker(0, 4, plan=[[2, 3, 0.3]], late_by=1.2)  # session 2: kind LATE at 0.3 s
    await _run_engine(w, kill_uid=None, max_seconds=3.5)
    (index, last_sent, planned), = w.late_records
    assert index == 2 and planned - last_sent > 1.2  # the keepalive's interval + the delay
    assert w.errors["engine:max_seconds"] == 1 and not w.closed_records  # the peer never times anyone out


async def test_a_refused_connection_is_a_failed_login_not_a_session() -> None:
    with trio.socket.socket() as probe:  # a port nobody listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    w = _worker(port, 3)
    w.t0 = trio.current_time()
    await Engine(w).run()  # every session failed: the engine ends at once, without max_seconds
    assert sorted(w.failed_records) == [0, 1, 2]
    assert w.errors["connect:ECONNREFUSED"] == 3 and w.logged_in == 0


async def test_the_engine_only_connects_within_loopback() -> None:
    with pytest.raises(ValueError, match="127.0.0.0/8"):
        Engine(Worker({**_worker(1, 1).cfg, "host": "192.0.2.1"}))
    with pytest.raises(ValueError, match="127.0.0.0/8"):
        Engine(Worker({**_worker(1, 1).cfg, "sources": ["127.0.0.2", "10.0.0.2"]}))


# ------------------------------------------------------------------------------ end to end (spawned server)

TICK = "0.25"


def _loadtest(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "idled.cli.main", "loadtest", "--quiet", "--json", str(out),
                           "--spawn", "--tick", TICK, "--keepalive", "1", *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    print(proc.stdout)
    print(proc.stderr[-3000:], file=sys.stderr)
    assert out.exists(), f"no result (exit {proc.returncode})"
    return proc, json.loads(out.read_text())


def _generator_figures_are_consistent(result: dict[str, Any]) -> None:
    gen = result["generator"]
    assert gen["workers"] == gen["measured"] == result["scenario"]["workers"]
    counts = gen["counts"]
    assert counts["logins"] == result["connections"]["logged_in"]
    assert counts["pings"] > 0 and counts["pongs"] > 0
    for name in ("ramp", "steady", "total"):
        assert gen[name]["cpu_seconds"] > 0 and gen[name]["ops"] > 0 and gen[name]["cpu_us_per_op"] > 0
    assert gen["total"]["ops"] == pytest.approx(gen["ramp"]["ops"] + gen["steady"]["ops"])
    assert gen["lag"]["count"] >= counts["pings"] and math.isfinite(gen["lag"]["p99"])
    assert gen["turn_max_seconds"] is not None and gen["coordinator_cpu_percent"] is not None


@pytest.mark.slow
def test_late_past_the_timeout_is_an_owed_offline_not_a_false_one(tmp_path: Path) -> None:
    # keepalive 1 s -> timeout 1.5 s; a keepalive 2 s late leaves a gap of ~3 s: the server must expire it
    proc, result = _loadtest(["--connections", "300", "--workers", "2", "--duration", "7", "--silent-fraction",
                              "0.1", "--bye-fraction", "0.05", "--late-fraction", "0.1", "--late-by", "2"], tmp_path)
    v = result["verdict"]
    assert (v["late_planned"], v["late_expected"], v["late_offlines"], v["late_missed"]) == (30, 30, 30, 0)
    assert v["false_offlines"] == 0 and v["generator_late"] == 0
    assert v["missed_offlines"] == 0 and v["early_offlines"] == 0 and v["logouts_seen"] == 15
    assert result["closes"] == {"silent:server:idle_timeout": 30, "bye:eof": 15, "late:server:idle_timeout": 30}
    assert result["errors"] == {}
    assert result["ok"] is True and proc.returncode == 0
    _generator_figures_are_consistent(result)
    assert "late sessions 30 (owed an offline 30, offline 30, missed 0)" in proc.stdout


@pytest.mark.slow
def test_late_within_the_timeout_owes_nothing_and_the_session_stays_online(tmp_path: Path) -> None:
    # a keepalive 0.2 s late: gaps of at most 1.05 + 0.2 s, inside the 1.5 s timeout -- an offline would be false
    proc, result = _loadtest(["--connections", "300", "--workers", "2", "--duration", "7", "--jitter", "0.05",
                              "--silent-fraction", "0.05", "--bye-fraction", "0", "--late-fraction", "0.2",
                              "--late-by", "0.2"], tmp_path)
    v = result["verdict"]
    assert (v["late_planned"], v["late_expected"], v["late_offlines"], v["late_missed"]) == (60, 0, 0, 0)
    assert v["false_offlines"] == 0 and v["generator_late"] == 0 and v["missed_offlines"] == 0
    assert result["closes"] == {"silent:server:idle_timeout": 15}  # nobody else was let go
    assert result["ok"] is True and proc.returncode == 0
    _generator_figures_are_consistent(result)


# --------------------------------------------------------------------------------------------- devices


def test_a_login_frame_patched_from_its_template_is_the_encoders() -> None:
    for devices in (1, 3):
        templates = login_templates(30.0, devices)
        for uid in (0, 1, 127, 128, 255, 65536, 2**32, 2**63 - 1):
            for d in range(devices):
                device = f"d{d}" if devices > 1 else None
                assert login_frame(templates[d], uid) == encode(Login("uid", uid, None, 30.0, device=device))


async def test_with_devices_each_uid_logs_in_from_k_connections_d0_to_dk() -> None:
    logins: list[tuple[object, object]] = []

    async def peer(stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        try:
            while (msg := await receive_message(stream, decoder)) is not None:
                if type(msg) is Login:
                    logins.append((msg.name, msg.device))
                    await stream.send_all(encode(Welcome("uid", msg.name, timeout=1.5)))
                elif msg is PING:
                    await stream.send_all(PONG_FRAME)
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    for secret in (None, b"s" * 32):  # (with a secret each login carries its uid's token: encoded per login)
        logins.clear()
        w = _worker(0, 6, devices=3, secret=secret.hex() if secret else None)
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"), peer, 0)
            w.cfg["port"] = w.port = listeners[0].socket.getsockname()[1]
            w.max_seconds = 0.6
            w.t0 = trio.current_time() + 0.05
            await Engine(w).run()
            nursery.cancel_scope.cancel()
        assert sorted(logins) == [(1000, "d0"), (1000, "d1"), (1000, "d2"), (1001, "d0"), (1001, "d1"), (1001, "d2")]
        assert w.logged_in == 6 and w.failed_records == []
