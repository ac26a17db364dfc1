"""Several cores (`idled edge --core A,B`, the client library's host lists): real daemons on loopback.

An active core and a hot standby (`idled serve --standby-of`, docs/ha.md); the standby refuses user and
gateway logins with `not_leader` naming the active (`leader`). "Promoted by hand": the standby stopped and
started again on its data directory and port without `--standby-of`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.client.trio import open_observer
from idled.protocol import PING, PONG, Error, Event, Login, Subscribe, Welcome
from tests.peers import Client, Daemon, free_port, serve_command
from tests.server.ha.standby_support import Gateway, records

pytestmark = pytest.mark.slow


def core_command(tmp_path: Path, name: str, port: int, *options: str) -> list[str]:
    return serve_command(tmp_path / name / "data", "--port", str(port), "--tick", "0.1", "--fsync", "always",
                         "--log-level", "info", "--metrics-port", "0", *options)


def edge_command(cores: str) -> list[str]:
    return [sys.executable, "-m", "idled.cli.main", "edge", "--core", cores, "--port", "0", "--log-level", "info"]


async def until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (``what`` names it in the failure)."""
    with trio.fail_after(timeout):
        while True:
            try:
                if predicate():
                    return
            except OSError:
                pass  # (a log directory not there yet)
            await trio.sleep(0.05)


async def online_seen(port: int, uids: set[str], from_seq: int = 1) -> dict[str, list[str]]:
    """Per uid, the kinds (an offline `restart` as "restart") read from seq ``from_seq`` until every uid in
    ``uids`` is online again after a restart offline."""
    peer = await Client.login(port, "observer", "check")
    await peer.send(Subscribe(from_seq))
    seen: dict[str, list[str]] = {}
    with trio.fail_after(20):
        while not all(seen.get(uid, [])[-2:] == ["restart", "online"] for uid in uids):
            message = await peer.recv()
            assert isinstance(message, Event), message
            seen.setdefault(str(message.uid), []).append("restart" if message.reason == "restart" else message.kind)
    await peer.stream.aclose()
    return seen


@pytest.fixture
def dirs(tmp_path: Path) -> Path:
    for name in ("a", "s"):
        (tmp_path / name).mkdir()
    return tmp_path


async def test_an_edge_given_the_standby_first_follows_the_leader_hint(dirs: Path) -> None:
    ap, sp = free_port(), free_port()
    async with Daemon(core_command(dirs, "a", ap), dirs / "a.err"), \
            Daemon(core_command(dirs, "s", sp, "--standby-of", f"127.0.0.1:{ap}"), dirs / "s.err"):
        refusal = await Client.connect(sp)
        await refusal.send(Login("uid", "x"))
        error = await refusal.recv()
        assert isinstance(error, Error) and error.code == "not_leader" and error.leader == f"127.0.0.1:{ap}"
        async with Daemon(edge_command(f"127.0.0.1:{sp},127.0.0.1:{ap}"), dirs / "edge.err") as edge:
            # It listens only after a core's welcome: the active's (the standby refuses gateways).
            assert f"core link to 127.0.0.1:{ap} up" in edge.stderr()
            user = await Client.login(edge.port, "uid", "alice", keepalive=30)
            await user.send(PING)
            assert await user.recv() is PONG
            obs = await Client.login(ap, "observer", "o")
            _, status = await obs.events_until_status(["alice"])
            assert status.online == {"alice": True}


async def test_edge_users_stay_through_a_failover_to_the_promoted_standby(dirs: Path) -> None:
    ap, sp = free_port(), free_port()
    act = Daemon(core_command(dirs, "a", ap), dirs / "a.err")
    sb = Daemon(core_command(dirs, "s", sp, "--standby-of", f"127.0.0.1:{ap}"), dirs / "s.err")
    promoted: Daemon | None = None
    try:
        await act.started()
        await sb.started()
        async with Daemon(edge_command(f"127.0.0.1:{ap},127.0.0.1:{sp}"), dirs / "edge.err") as edge:
            users = [await Client.login(edge.port, "uid", f"u{i}", keepalive=30) for i in range(3)]
            await until(lambda: len(records(dirs / "s/data")) >= 3, what="the standby to hold the onlines")
            act.kill()
            for user in users:  # the edge answers its users while no core leads
                await user.send(PING)
                assert await user.recv() is PONG
            await sb.stop()
            promoted = Daemon(core_command(dirs, "s", sp), dirs / "s2.err")
            await promoted.started()
            await until(lambda: f"edge: core is now 127.0.0.1:{sp} (was 127.0.0.1:{ap})" in edge.stderr(),
                        timeout=20, what="the edge to switch cores")
            seen = await online_seen(sp, {"u0", "u1", "u2"})
            assert all(kinds == ["online", "restart", "online"] for kinds in seen.values()), seen
            for user in users:  # still connected: pongs, no error frame
                await user.send(PING)
                assert await user.recv() is PONG
    finally:
        for daemon in (act, sb, promoted):
            if daemon is not None:
                daemon.kill()


async def test_an_observer_given_two_cores_resumes_on_the_promoted_one_without_a_missing_seq(dirs: Path) -> None:
    ap, sp = free_port(), free_port()
    act = Daemon(core_command(dirs, "a", ap), dirs / "a.err")
    sb = Daemon(core_command(dirs, "s", sp, "--standby-of", f"127.0.0.1:{ap}"), dirs / "s.err")
    promoted: Daemon | None = None
    try:
        await act.started()
        await sb.started()
        seqs: list[int] = []
        late_seen = 0
        async with open_observer(f"127.0.0.1:{ap},127.0.0.1:{sp}", None, "obs", after=0, durable=True) as observer:
            async def read(done: Callable[[], bool]) -> None:
                nonlocal late_seen
                with trio.fail_after(20):
                    async for event in observer:
                        seqs.append(event.seq)
                        late_seen += str(event.uid).startswith("v")
                        if done():
                            return

            gateway = Gateway(ap)
            gateway.churn(10)  # 15 events
            await read(lambda: len(seqs) >= 15)
            await until(lambda: len(records(dirs / "s/data")) >= 15, what="the standby to catch up")
            act.kill()
            gateway.close()
            await sb.stop()
            promoted = Daemon(core_command(dirs, "s", sp), dirs / "s2.err")
            await promoted.started()
            late = Gateway(sp, name="late")
            late.churn(4, prefix="v")  # the promoted core's own events (6): its seqs continue the log's
            await read(lambda: late_seen == 6)
            assert (observer.host, observer.port) == ("127.0.0.1", sp)
            late.close()
        logged = [seq for seq in sorted(records(dirs / "s/data")) if seq <= seqs[-1]]
        assert seqs == logged, (seqs, logged)  # every durable seq up to the last one read: once, in order
    finally:
        for daemon in (act, sb, promoted):
            if daemon is not None:
                daemon.kill()


async def test_a_session_given_the_standby_first_logs_in_at_the_active(dirs: Path) -> None:
    from idled.client.trio import open_session

    ap, sp = free_port(), free_port()
    async with Daemon(core_command(dirs, "a", ap), dirs / "a.err"), \
            Daemon(core_command(dirs, "s", sp, "--standby-of", f"127.0.0.1:{ap}"), dirs / "s.err"):
        async with open_session([f"127.0.0.1:{sp}", f"127.0.0.1:{ap}"], None, "bob", keepalive=30,
                                reconnect=False) as session:
            assert session.port == ap and isinstance(session.welcome, Welcome)



async def test_idled_user_and_query_take_a_core_list(dirs: Path) -> None:
    ap, sp = free_port(), free_port()
    async with Daemon(core_command(dirs, "a", ap), dirs / "a.err"), \
            Daemon(core_command(dirs, "s", sp, "--standby-of", f"127.0.0.1:{ap}"), dirs / "s.err"):
        cores = f"127.0.0.1:{sp},127.0.0.1:{ap}"  # the standby first: refused, the hint leads to the active
        out = dirs / "user.out"
        with open(out, "wb") as stdout:
            user = await trio.lowlevel.open_process(
                [sys.executable, "-m", "idled.cli.main", "user", "--core", cores, "carol"], stdout=stdout)
        try:
            await until(lambda: f"on 127.0.0.1:{ap};" in out.read_text(), what="idled user's login at the active")
            # A query is an observer: the standby would answer it too (from its replicated log).
            result = await trio.run_process(
                [sys.executable, "-m", "idled.cli.main", "query", "--core", cores, "--json", "carol"],
                capture_stdout=True, capture_stderr=True, check=False)
            assert result.returncode == 0, result.stderr
        finally:
            user.kill()
            await user.wait()
