"""Replication is a role of its own (issue 33): only a ``standby`` login may ``replicate``, and only its acks
count for ``--sync-standby``. Real daemons on loopback, auth on (a shared secret), real SIGSTOP.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from idled.log.shipping import record_seqs
from idled.protocol import NEED_DATA, Error, FrameDecoder, Login, Welcome, encode, tokens
from idled.protocol.replication import Records, encode_ack, encode_replicate, parse_replication_message

from tests.server.standby_support import Gateway, Watcher, metric, records, standby, status, sync_active, wait_for

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
        real = [link["name"] for link in status(act_metrics)["replication"]["standbys"]]
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
        assert [link["name"] for link in status(act_metrics)["replication"]["standbys"]] == real
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
