"""`idled edge` end to end: real `idled serve` and `idled edge` subprocesses on loopback.

A user through an edge must see exactly what a direct user sees (welcome timeout, pong, idle_timeout,
kicked, auth_failed, server_shutdown), observers must see the same record, and a core restart must not drop
the edge's users.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.protocol import BYE, PING, PONG, Attach, Error, Event, Login, Msg, Pong, Subscribe, Welcome, tokens
from tests.peers import Client, Daemon, free_port, serve_command

pytestmark = pytest.mark.slow

TICK = 0.1


def edge_command(core_port: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "idled.cli.main", "edge", "--core", f"127.0.0.1:{core_port}", "--port", "0", *options]


@asynccontextmanager
async def daemons(*specs: tuple[list[str], Path]) -> AsyncIterator[list[Daemon]]:
    """Each (command, stderr path) started in turn; all killed when the block ends."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Daemon(command, path)) for command, path in specs]


def core(tmp_path: Path, *options: str, port: int = 0) -> tuple[list[str], Path]:
    command = serve_command(tmp_path / "data", "--tick", str(TICK), "--fsync", "never", "--metrics-port", "0", *options)
    if port:
        command += ["--port", str(port)]
    return command, tmp_path / "core.err"


async def observer(port: int, from_seq: int | None = None) -> Client:
    peer = await Client.login(port, "observer", "obs")
    await peer.send(Subscribe(from_seq))
    if from_seq is None:
        # "From now" is in place once a ping after it is answered (docs/protocol.md): through the edge's
        # relay a login on another connection could otherwise reach the core first and be missed.
        await peer.send(PING)
        assert await peer.recv() is PONG
    return peer


async def next_event(peer: Client, timeout: float = 10.0) -> Event:
    message = await peer.recv(timeout)
    assert isinstance(message, Event), message
    return message


async def test_a_user_through_an_edge_sees_what_a_direct_user_sees(tmp_path: Path) -> None:
    async with daemons(core(tmp_path, "--timeout", "7")) as (c,):
        async with daemons((edge_command(c.port), tmp_path / "edge.err")) as (e,):
            obs = await observer(e.port)  # through the edge's relay
            for keepalive in (None, 4.0, 1.0, 10_000.0):  # 1 s: the smallest keepalive allowed
                direct = await Client.connect(c.port)
                await direct.send(Login("uid", "direct", None, keepalive))
                via = await Client.connect(e.port)
                await via.send(Login("uid", "via", None, keepalive))
                assert (await via.expect(Welcome)).timeout == (await direct.expect(Welcome)).timeout
                await direct.send(BYE)
                await via.send(BYE)
                assert await via.recv() is None
                assert await direct.recv() is None  # its offline is published before alice's online below
            user = await Client.login(e.port, "uid", "alice", keepalive=30)
            await user.send(PING)
            assert await user.recv() is PONG
            await user.send(Msg({"hello": [1, 2]}))
            await user.send(PING)
            assert await user.recv() is PONG
            await user.send(BYE)
            assert await user.recv() is None
            events = [(ev.uid, ev.kind, ev.reason) for ev in [await next_event(obs) for _ in range(4 * 4 + 2)]]
            assert events[-2:] == [("alice", "online", "login"), ("alice", "offline", "logout")]
            assert ("via", "offline", "logout") in events


async def test_idle_user_gets_idle_timeout_and_the_offline_is_never_early(tmp_path: Path) -> None:
    async with daemons(core(tmp_path, "--timeout", "1")) as (c,):
        async with daemons((edge_command(c.port), tmp_path / "edge.err")) as (e,):
            obs = await observer(c.port)
            user = await Client.login(e.port, "uid", "idler")
            await trio.sleep(0.5)
            await user.send(PING)  # activity at the edge moves the deadline (relayed within 10 ms)
            assert await user.recv() is PONG
            sent = trio.current_time()
            error = await user.recv(5)
            waited = trio.current_time() - sent
            assert isinstance(error, Error) and error.code == "idle_timeout"
            assert 1.0 - 0.01 <= waited <= 1.0 + TICK + 0.010 + 0.25, waited  # + batch, + scheduling slack
            online, offline = await next_event(obs), await next_event(obs)
            assert (online.kind, offline.kind, offline.reason) == ("online", "offline", "idle")
            assert offline.ts >= offline.deadline


async def test_newest_login_wins_across_two_edges_without_a_flap(tmp_path: Path) -> None:
    async with daemons(core(tmp_path)) as (c,):
        async with daemons((edge_command(c.port, "--host", "127.0.0.1"), tmp_path / "e1.err"),
                           (edge_command(c.port, "--host", "127.0.0.2"), tmp_path / "e2.err")) as (e1, e2):
            obs = await observer(c.port)
            old = await Client.login(e1.port, "uid", "bob")
            assert (await next_event(obs)).kind == "online"

            async def takes_over(previous: Client) -> Client:
                """bob logs in on e2: welcomed, served, and the previous connection is kicked."""
                new = await Client.login(e2.port, "uid", "bob", host="127.0.0.2")
                await previous.expect_error("kicked")
                await new.send(PING)
                assert await new.recv() is PONG
                return new

            new = await takes_over(old)
            # Locally too: a second login on the same edge kicks the first, with no event either. (Held in a
            # name: a connection dropped here would end bob's session.)
            latest = await takes_over(new)
            await trio.sleep(0.2)
            events, status = await obs.events_until_status(["bob"])
            assert events == [] and status.online == {"bob": True}, latest


async def test_auth_on_the_edge(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s" * 32)
    secret = tokens.load_secret(secret_file)
    async with daemons(core(tmp_path, "--secret-file", str(secret_file))) as (c,):
        async with daemons((edge_command(c.port, "--secret-file", str(secret_file)), tmp_path / "edge.err")) as (e,):
            bad = await Client.connect(e.port)
            await bad.send(Login("uid", "mallory", tokens.mint(secret, "uid", "alice", 2e9)))
            await bad.expect_error("auth_failed")
            good = await Client.login(e.port, "uid", "alice", token=tokens.mint(secret, "uid", "alice", 2e9))
            await good.send(PING)
            assert await good.recv() is PONG
            obs = await Client.connect(e.port)  # relayed: the core checks it
            await obs.send(Login("observer", "obs", "forged"))
            await obs.expect_error("auth_failed")


async def test_core_restart_keeps_the_edge_users(tmp_path: Path) -> None:
    port = free_port()
    async with daemons(core(tmp_path, "--timeout", "5", port=port)) as (c,):
        async with daemons((edge_command(port), tmp_path / "edge.err")) as (e,):
            users = [await Client.login(e.port, "uid", f"u{i}") for i in range(3)]
            await trio.sleep(0.5)  # the online records reach the log (the writer's group commit)
            c.kill()
            for user in users:  # the edge answers pings while the core is gone
                await user.send(PING)
                assert await user.recv() is PONG
            restarted = Daemon(core(tmp_path, "--timeout", "5", port=port)[0], tmp_path / "core2.err")
            try:
                await restarted.started()
                obs = await observer(port, from_seq=1)  # the whole record: before the kill, restart, re-attach
                seen: dict[Any, list[str]] = {}
                with trio.fail_after(15):
                    while any(len(seen.get(f"u{i}", [])) < 3 for i in range(3)):
                        ev = await next_event(obs)
                        seen.setdefault(ev.uid, []).append(ev.kind if ev.reason != "restart" else "restart")
                assert all(kinds == ["online", "restart", "online"] for kinds in seen.values()), seen
                for user in users:
                    await user.send(PING)
                    assert await user.recv() is PONG
                _, status = await obs.events_until_status(["u0", "u1", "u2"])
                assert all(status.online.values())
            finally:
                restarted.kill()


async def test_gateway_through_the_edge_and_edge_drain(tmp_path: Path) -> None:
    async with daemons(core(tmp_path)) as (c,):
        async with daemons((edge_command(c.port), tmp_path / "edge.err")) as (e,):
            obs = await observer(c.port)
            gw = await Client.login(e.port, "gateway", "app")
            await gw.send(Attach(("g1",)))
            assert (await next_event(obs)).uid == "g1"
            await gw.send(PING)
            assert isinstance(await gw.recv(), Pong)
            user = await Client.login(e.port, "uid", "leaving")
            assert (await next_event(obs)).uid == "leaving"
            e.proc.send_signal(signal.SIGTERM)
            await user.expect_error("server_shutdown")
            assert await e.wait() == 0
            ev = await next_event(obs)
            assert (ev.uid, ev.kind, ev.reason) == ("leaving", "offline", "shutdown")


async def test_edges_sharing_a_socket_leave_connections_to_the_one_with_room(tmp_path: Path) -> None:
    """Two edges adopt one listening socket (--listen-fd, as --workers passes it). The small one (2 users)
    stops accepting when full, so the others go to the big one instead of being refused ``busy``; only when
    both are full is a connection refused (``busy``, at once rather than hanging in the backlog)."""
    shared = socket.create_server(("127.0.0.1", 0))
    port = shared.getsockname()[1]
    try:
        async with daemons(core(tmp_path)) as (c,):
            specs = []
            for name, limit in (("small", 2), ("big", 6)):
                command = [sys.executable, "-m", "idled.cli.main", "edge", "--core", f"127.0.0.1:{c.port}",
                           "--listen-fd", str(shared.fileno()), "--max-connections", str(limit), "--name", name]
                specs.append(Daemon(command, tmp_path / f"{name}.err", pass_fds=(shared.fileno(),)))
            try:
                for edge in specs:
                    assert await edge.started() == port
                users = [await Client.login(port, "uid", f"u{i}") for i in range(8)]  # 2 + 6: nobody refused
                extra = await Client.connect(port, reset_is_eof=True)  # closed unread: may be a reset
                await extra.send(Login("uid", "one-too-many"))
                await extra.expect_error("busy")
                await users[0].send(BYE)
                assert await users[0].recv() is None
                with trio.fail_after(10):  # a freed slot is taken again (whichever edge it was on)
                    while True:
                        again = await Client.connect(port, reset_is_eof=True)
                        await again.send(Login("uid", "again"))
                        if isinstance(await again.recv(), Welcome):
                            break
                        await trio.sleep(0.1)
            finally:
                for edge in specs:
                    edge.kill()
    finally:
        shared.close()


async def test_client_gateway_on_ended_hears_idle_kicked_and_shutdown_from_a_real_core(tmp_path: Path) -> None:
    """The client library's Gateway(on_ended=...) (what an edge does by hand) against a real `idled serve`."""
    from idled.client.trio import open_gateway

    ended: list[tuple[Any, str]] = []
    heard = trio.Event()

    def on_ended(uids: tuple[Any, ...], reason: str) -> None:  # once per notice frame
        ended.extend((uid, reason) for uid in uids)
        heard.set()

    async def next_notice() -> tuple[Any, str]:
        nonlocal heard
        with trio.fail_after(10):
            while not ended:
                await heard.wait()
                heard = trio.Event()
        return ended.pop(0)

    async with daemons(core(tmp_path, "--timeout", "30")) as (c,):
        async with open_gateway("127.0.0.1", c.port, "lib-gw", on_ended=on_ended, flush_interval=0.01,
                                reconnect=False) as gateway:
            await gateway.attach(["quiet"], keepalive=1.0)  # timeout 1.5 s, never touched
            await gateway.attach(["taken", "stays"], keepalive=30.0)
            assert await next_notice() == ("quiet", "idle")
            direct = await Client.login(c.port, "uid", "taken")  # newest wins: the gateway's session is kicked
            assert await next_notice() == ("taken", "kicked")
            assert gateway.live == 1  # idle and kicked uids are no longer live here
            c.proc.send_signal(signal.SIGTERM)
            assert await next_notice() == ("stays", "shutdown")
            assert gateway.live == 1  # a shutdown uid stays live: re-attached when the server is back
            await direct.expect_error("server_shutdown")
