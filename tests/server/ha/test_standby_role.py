"""Replication is a role of its own (issue 33): only a ``standby`` login may ``replicate``, and only its acks
count for ``--sync-standby``. Real daemons on loopback, auth on (a shared secret), real SIGSTOP: an impostor
beside a paused sync standby, a standby core (no cascading), ``--workers`` (the edges relay standbys), and a
standby upgraded before its active. The role's auth matrix on an in-process core: test_standby_auth.py.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import trio

from idled.log.shipping import record_seqs
from idled.protocol import (
    NEED_DATA, Error, ErrorCode, FrameDecoder, Login, ProtocolError, Replicate, Welcome, encode, receive_message, tokens,
)
from idled.protocol.replication import Records, encode_ack, encode_replicate, parse_replication_message
from idled.server.app import Server
from idled.server.roles.observers import FrameWriter

from tests.peers import Daemon, free_port, running, serve_command
from tests.server.ha.standby_support import Gateway, Watcher, metric, records, standby, status, sync_active, wait_for

pytestmark = pytest.mark.slow

HOLD = 0.5  # seconds we watch a durable observer *not* advance (its absence is the point)
SECRET = b"a shared secret of 32 bytes....."


def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


class Impostor(threading.Thread):
    """A peer that sends ``replicate`` after ``login`` and acknowledges every record it is sent, at once: the
    fastest "standby" there could be. ``frames`` is what it received, in order."""

    def __init__(self, port: int, login: Login) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(encode(login) + encode_replicate(1, None))
        self.frames: list[object] = []
        self.closed = threading.Event()
        self.start()

    def run(self) -> None:
        decoder = FrameDecoder(1 << 22, parse=parse_replication_message)
        last = 0
        try:
            while data := self.sock.recv(65536):
                decoder.receive_data(data)
                while (message := decoder.next_event()) is not NEED_DATA:
                    self.frames.append(message)
                    if type(message) is Records:
                        if message.records:
                            last = record_seqs(message.records)[-1]
                        self.sock.sendall(encode_ack(last))
        except OSError:
            pass
        self.closed.set()

    def records(self) -> int:
        return sum(len(frame.records) for frame in self.frames if type(frame) is Records)

    def close(self) -> None:
        self.sock.close()


def on_disk(data_dir: Path) -> int:
    return max(records(data_dir), default=0)


def test_an_observer_token_cannot_pose_as_the_sync_standby(tmp_path: Path) -> None:
    """The issue's probe: an observer token sends ``replicate`` and acks everything at once, beside a real sync
    standby that is paused. Durable observers must still wait for the real one, the gauge must drop once it
    has been silent for SYNC_TIMEOUT, and /status must list only the real standby."""
    secret = secret_file(tmp_path)
    act, act_metrics = sync_active(tmp_path / "a", "--secret-file", secret)
    sb, _ = standby(tmp_path / "s", act, "--fsync", "always", "--secret-file", secret)
    rogue = fast = durable = None
    try:
        wait_for(lambda: "sync standby attached" in act.stderr(), what="the real standby to become synchronous")
        real = [link["name"] for link in status(act_metrics, SECRET)["replication"]["standbys"]]
        assert len(real) == 1
        token = tokens.mint(SECRET, "observer", "dashboard", time.time() + 3600)
        rogue = Impostor(act.port, Login("observer", "dashboard", token))
        fast, durable = Watcher(act.port, durable=False, secret=SECRET), Watcher(act.port, durable=True, secret=SECRET)
        gateway = Gateway(act.port, secret=SECRET)
        gateway.churn(10)
        wait_for(lambda: durable.last == fast.last == 15, what="both observers")

        sb.proc.send_signal(signal.SIGSTOP)
        held = on_disk(tmp_path / "s/data")  # --fsync always there: what it holds is what it has synced
        gateway.churn(10, prefix="v")
        wait_for(lambda: fast.last == 30 and on_disk(tmp_path / "a/data") == 30, what="the active's events")
        time.sleep(HOLD)
        assert durable.last <= held < 30, ("durable observers did not wait for the real standby", durable.last, held)
        assert [link["name"] for link in status(act_metrics, SECRET)["replication"]["standbys"]] == real
        wait_for(lambda: "acknowledged nothing for" in act.stderr(), timeout=15, what="the sync standby's timeout")
        wait_for(lambda: metric(act_metrics, "idled_sync_standby") == 0, what="the gauge to drop")
        assert metric(act_metrics, "idled_standbys_attached") == 1
        wait_for(lambda: durable.last == 30, what="durable observers after the fallback")

        # The impostor got no record: its replicate was refused, and said why.
        assert rogue.closed.wait(5)
        assert rogue.records() == 0
        assert [type(frame) for frame in rogue.frames] == [Welcome, Error], rogue.frames
        error = rogue.frames[-1]
        assert isinstance(error, Error) and error.code == "not_allowed" and "standby" in error.reason
        sb.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: act.stderr().count("sync standby attached") >= 2, what="the real standby back")
        gateway.close()
    finally:
        sb.proc.send_signal(signal.SIGCONT)
        for peer in (rogue, fast, durable):
            if peer is not None:
                peer.close()
        sb.stop()
        act.stop()


def exchange(port: int, login: Login, timeout: float = 10.0) -> list[object]:
    """What a peer that sends ``login`` and ``replicate`` gets until the server closes (or ``timeout``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    decoder = FrameDecoder(1 << 22, parse=parse_replication_message)
    out: list[object] = []
    try:
        sock.sendall(encode(login) + encode_replicate(1, None))
        while data := sock.recv(65536):
            decoder.receive_data(data)
            while (message := decoder.next_event()) is not NEED_DATA:
                out.append(message)
                if type(message) is Records:
                    return out  # replicating: enough said
    except TimeoutError:
        pass
    finally:
        sock.close()
    return out


def refused_logins(name: str) -> dict[str, Login]:
    """Every way a ``standby`` login can fail its token check (as tests/server/ha/test_standby_auth.py's)."""
    later = time.time() + 3600
    mint = tokens.mint
    return {
        "no token": Login("standby", name),
        "an observer token": Login("standby", name, mint(SECRET, "observer", name, later)),
        "a uid token": Login("standby", name, mint(SECRET, "uid", name, later)),
        "a gateway token": Login("standby", name, mint(SECRET, "gateway", name, later)),
        "an api token": Login("standby", name, mint(SECRET, "api", name, later)),
        "expired": Login("standby", name, mint(SECRET, "standby", name, time.time() - 1)),
        "another secret": Login("standby", name, mint(b"another secret of 32 bytes......", "standby", name, later)),
        "another standby's": Login("standby", name, mint(SECRET, "standby", name + "-other", later)),
    }


def assert_auth_matrix(port: int, name: str) -> None:
    for what, login in refused_logins(name).items():
        reply = exchange(port, login)
        assert [type(m) for m in reply] == [Error] and reply[0].code == "auth_failed", (what, reply)  # type: ignore[attr-defined]


def good_login(name: str) -> Login:
    return Login("standby", name, tokens.mint(SECRET, "standby", name, time.time() + 3600))


def test_a_standby_core_refuses_standby_logins_and_a_standby_of_it_waits_for_its_promotion(tmp_path: Path) -> None:
    """No cascading: a standby of a standby is refused with not_leader (naming the active) and tries again, so
    it follows that core once it is promoted."""
    secret = secret_file(tmp_path)
    act, _ = sync_active(tmp_path / "a", "--secret-file", secret)
    first, first_metrics = standby(tmp_path / "s", act, "--fsync", "always", "--secret-file", secret)
    second = None
    try:
        gateway = Gateway(act.port, secret=SECRET)
        gateway.churn(10)
        wait_for(lambda: status(first_metrics)["standby"]["last_seq"] == 15, what="the first standby")
        gateway.close()
        assert_auth_matrix(first.port, "cascade")
        reply = exchange(first.port, good_login("cascade"))
        assert [type(m) for m in reply] == [Error], reply
        error = reply[0]
        assert isinstance(error, Error) and error.code == "not_leader" and error.leader == f"127.0.0.1:{act.port}"
        assert "no cascading" in error.reason

        second, second_metrics = standby(tmp_path / "t", first, "--fsync", "always", "--secret-file", secret)
        wait_for(lambda: "no cascading" in (status(second_metrics)["standby"]["error"] or ""), what="the refusal")
        assert not status(second_metrics)["standby"]["connected"] and records(tmp_path / "t/data") == {}
        assert "not_leader" in second.stderr() and "no cascading" in second.stderr()

        act.stop()  # the active is gone: promote the first standby by hand (idled promote sends SIGUSR1)
        first.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: status(first_metrics)["role"] == "active", what="the promotion")
        wait_for(lambda: status(second_metrics)["standby"]["connected"], what="the second standby to follow it")
        wait_for(lambda: records(tmp_path / "t/data") == records(tmp_path / "s/data"), what="the copy")
    finally:
        if second is not None:
            second.stop()
        first.stop()
        act.stop()


def test_a_standby_replicates_from_a_workers_daemon_through_its_edges(tmp_path: Path) -> None:
    """Under --workers the public port is the edges': they relay a standby login to the core, as they relay
    gateways and observers; their doorway checks its token first."""
    secret = secret_file(tmp_path)
    act, act_metrics = sync_active(tmp_path / "a", "--secret-file", secret, "--workers", "2")
    sb, sb_metrics = standby(tmp_path / "s", act, "--fsync", "always", "--secret-file", secret)
    try:
        wait_for(lambda: status(act_metrics, SECRET)["replication"]["sync_attached"], what="the standby through an edge")
        gateway = Gateway(act.port, secret=SECRET)
        gateway.churn(10)
        wait_for(lambda: status(sb_metrics)["standby"]["last_seq"] == 15, what="the standby's copy")
        assert records(tmp_path / "s/data") == records(tmp_path / "a/data")
        assert status(act_metrics)["connections"]["standby"] == 1
        assert metric(act_metrics, "idled_standbys_attached") == 1

        assert_auth_matrix(act.port, "through-edges")  # refused by the edge's doorway
        reply = exchange(act.port, good_login("through-edges"))
        assert [type(m) for m in reply] == [Welcome, Records], reply
        assert isinstance(reply[0], Welcome) and reply[0].role == "standby"
        # An observer token's replicate is refused by the core, through the edge, as on a core alone.
        token = tokens.mint(SECRET, "observer", "dashboard", time.time() + 60)
        reply = exchange(act.port, Login("observer", "dashboard", token))
        assert [type(m) for m in reply] == [Welcome, Error] and "standby login" in reply[1].reason  # type: ignore[attr-defined]
        gateway.close()
    finally:
        sb.stop()
        act.stop()


class OlderActive:
    """Roles for an in-process core that answers as an active of the version before the standby role did: a
    ``standby`` login is a parse error (that version's words), and an observer's first request may be
    ``replicate``, served by the replication feed. ``kick()`` ends the link it serves."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.scope: trio.CancelScope | None = None

    async def standby(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "unknown field 'standby' in login")

    async def observer(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        await stream.send_all(encode(Welcome("observer", login.name)))
        message = await receive_message(stream, decoder)
        assert isinstance(message, Replicate), message
        replicas = self.server.running.replicas
        assert replicas is not None
        with trio.CancelScope() as self.scope:
            await replicas.run(stream, decoder, message, FrameWriter(stream), str(login.name))

    def kick(self) -> None:
        assert self.scope is not None
        self.scope.cancel()


async def test_a_standby_upgraded_first_replicates_from_an_older_active_then_as_a_standby(tmp_path: Path) -> None:
    """The upgrade order docs/ha.md gives: standbys first (they log in as observers to the older active, whose
    refusal of the standby login says it is older), then the active (its refusal of the observer's replicate
    says it is newer: the standby logs in as a standby from then on). Replication never stops."""
    async with running(tmp_path / "a", listen=True, fsync="always") as h:
        door = h.server.running.doorway
        assert door is not None
        newer = dict(door.roles)
        older = OlderActive(h.server)
        door.roles = {**newer, "standby": older.standby, "observer": older.observer}
        metrics_port = free_port()
        command = serve_command(tmp_path / "s/data", "--standby-of", f"127.0.0.1:{h.port}", "--fsync", "always",
                                "--metrics-port", str(metrics_port), "--log-level", "info")
        async with Daemon(command, tmp_path / "s.stderr") as sb:
            await h.traffic(3)
            await trio.to_thread.run_sync(lambda: wait_for(
                lambda: status(metrics_port)["standby"]["last_seq"] == 6, what="replication as an observer"))
            assert "predates the standby login" in sb.stderr()

            door.roles = newer  # the active is upgraded; its link to the standby ends (as in its restart)
            older.kick()
            await h.traffic(2)
            await trio.to_thread.run_sync(lambda: wait_for(
                lambda: status(metrics_port)["standby"]["last_seq"] == 10, what="replication as a standby"))
            assert "now takes the standby login: logging in as a standby" in sb.stderr()
            replicas = h.server.running.replicas
            assert replicas is not None and replicas.attached == 1
            assert h.server.connections["standby"] == 1 and h.server.connections["observer"] == 0
            assert "replication stopped" not in sb.stderr()
