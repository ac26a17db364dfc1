"""Synchronous replication (``--sync-standby``) and the divergence check: real daemons on loopback (docs/ha.md)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from idled.log.shipping import decode_raw
from idled.protocol import Login, encode
from idled.protocol.replication import encode_replicate

from tests.server.ha.standby_support import (
    Gateway, Watcher, active, metric, records, standby, status, sync_active, wait_for,
)

pytestmark = pytest.mark.slow

HOLD = 0.5  # seconds we watch a durable observer *not* advance (nothing to wait for: its absence is the point)


def frame_of(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def on_disk(data_dir: Path) -> int:
    return max(records(data_dir), default=0)


def test_durable_observers_wait_for_the_sync_standby(tmp_path: Path) -> None:
    act, act_metrics = sync_active(tmp_path / "a")
    sb, sb_metrics = standby(tmp_path / "s", act, "--fsync", "always")
    fast = durable = None
    try:
        wait_for(lambda: "sync standby attached" in act.stderr(), what="the standby to become synchronous")
        assert metric(act_metrics, "idled_sync_standby") == 1
        assert status(act_metrics)["replication"]["sync_attached"]
        fast, durable = Watcher(act.port, durable=False), Watcher(act.port, durable=True)
        gateway = Gateway(act.port)
        gateway.churn(10)
        wait_for(lambda: durable.last == fast.last == 15, what="both observers")
        assert status(sb_metrics)["standby"]["synced"] >= 15

        # A stopped standby acknowledges nothing: durable observers stop where it stopped, live ones go on.
        sb.proc.send_signal(signal.SIGSTOP)
        held = on_disk(tmp_path / "s/data")  # --fsync always there: what it holds is what it has synced
        gateway.churn(10, prefix="v")
        wait_for(lambda: fast.last == 30 and on_disk(tmp_path / "a/data") == 30, what="the active's events")
        time.sleep(HOLD)
        assert durable.last <= held < 30, (durable.last, held)
        sb.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: durable.last == 30, what="durable observers to catch up once it acknowledges")
        assert on_disk(tmp_path / "s/data") >= 30

        # Stopped for longer than SYNC_TIMEOUT: no longer synchronous, durable observers go on without it.
        sb.proc.send_signal(signal.SIGSTOP)
        gateway.churn(10, prefix="w")
        wait_for(lambda: "acknowledged nothing for" in act.stderr(), timeout=15, what="the sync standby's timeout")
        wait_for(lambda: durable.last == 45, what="durable observers after the fallback")
        assert metric(act_metrics, "idled_sync_standby") == 0
        sb.proc.send_signal(signal.SIGCONT)
        # (On waking it may ack on its old connection or find that one silent for too long and reconnect: either
        # way it is synchronous again once its acks have caught up.)
        wait_for(lambda: act.stderr().count("sync standby attached") >= 2, what="the standby to be synchronous again")

        # Killed: its link ends, the active falls back at once and says so.
        sb.proc.send_signal(signal.SIGKILL)
        sb.proc.wait()
        wait_for(lambda: not status(act_metrics)["replication"]["sync_attached"], what="the lost link")
        assert "its link ended): durable observers fall back" in act.stderr()
        assert metric(act_metrics, "idled_sync_standby") == 0
        gateway.churn(10, prefix="x")
        wait_for(lambda: durable.last == 60, what="durable observers with no standby")
        assert act.stderr().count("sync standby lost") == act.stderr().count("sync standby attached")
        gateway.close()
    finally:
        for watcher in (fast, durable):
            if watcher is not None:
                watcher.close()
        sb.stop()
        act.stop()


def test_diverged_standby_resyncs_and_keeps_its_old_log_aside(tmp_path: Path) -> None:
    """An old leader back as a standby: its last records were its own (never acknowledged), the new active
    wrote others under the same seqs."""
    with active(tmp_path / "a", "--fsync", "always") as act:
        gateway = Gateway(act.port)
        gateway.churn(10)
        sb, metrics = standby(tmp_path / "s", act, "--fsync", "always")
        with sb:
            wait_for(lambda: status(metrics)["standby"]["last_seq"] >= 15, what="the first catch-up")
        # The copy runs as an active of its own for a while: seqs 16.. hold its records.
        shutil.copytree(tmp_path / "s", tmp_path / "d")
        with active(tmp_path / "d", "--fsync", "always") as rogue:
            other = Gateway(rogue.port)
            other.churn(6, prefix="rogue")
            wait_for(lambda: on_disk(tmp_path / "d/data") >= 24, what="the copy's own records")
            other.close()
        theirs_before = records(tmp_path / "d/data")
        # The real active writes different records under the same seqs (and more).
        gateway.churn(20, prefix="real")
        wait_for(lambda: on_disk(tmp_path / "a/data") >= 45, what="the active's records")
        assert records(tmp_path / "a/data")[16] != theirs_before[16]

        sb, metrics = standby(tmp_path / "d", act, "--fsync", "always")
        with sb:
            final = on_disk(tmp_path / "a/data")
            wait_for(lambda: status(metrics)["standby"]["last_seq"] >= final, what="the re-synced copy")
            diverged = max(theirs_before)
            assert f"standby: diverged from the active: our last record, seq {diverged}" in sb.stderr()
            assert f"diverged: its last record, seq {diverged}, differs from this core's" in act.stderr()
            assert status(metrics)["standby"]["resyncs"] == 1
            # Caught up again after a re-sync with no snapshot: streaming, not "resyncing" for ever.
            wait_for(lambda: status(metrics)["standby"]["state"] == "streaming", what="streaming after the re-sync")
            # Compared while the gateway is open: its close would add the active's offlines.
            assert records(tmp_path / "d/data") == records(tmp_path / "a/data")
            segments = sorted(p.name for p in (tmp_path / "a/data").glob("*.seg"))
            assert segments == sorted(p.name for p in (tmp_path / "d/data").glob("*.seg"))
            for name in segments:
                assert (tmp_path / "a/data" / name).read_bytes() == (tmp_path / "d/data" / name).read_bytes()
        gateway.close()
    asides = list((tmp_path / "d/data").glob("aside-*"))
    assert len(asides) == 1 and records(asides[0]) == theirs_before  # nothing of the old log is lost


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("bad, code", [
    (frame_of({"op": "ack", "seq": "x"}), b"bad_message"),  # malformed
    (frame_of({"op": "ack", "seq": 10**6}), b"bad_message"),  # beyond what was sent
    (frame_of({"op": "ack", "seq": 1, "pad": "x" * 300}), b"too_large"),  # too large for the standby's frames
    (frame_of({"op": "subscribe"}), b"not_allowed"),  # not a standby's request
    (frame_of({"op": "replicate", "from": 1}), b"not_allowed"),  # its one replicate was sent already
])
def test_bad_frame_from_a_standby_ends_its_link_only(tmp_path: Path, bad: bytes, code: bytes) -> None:
    act, act_metrics = sync_active(tmp_path / "a")
    sb, sb_metrics = standby(tmp_path / "s", act, "--fsync", "always")
    try:
        wait_for(lambda: "sync standby attached" in act.stderr(), what="the real standby")
        rogue = socket.create_connection(("127.0.0.1", act.port), timeout=10)
        rogue.sendall(encode(Login("standby", "rogue")) + encode_replicate(1, None))
        rogue.sendall(bad)
        reply = read_until_closed(rogue)
        assert code in reply
        rogue.close()
        gateway = Gateway(act.port)
        gateway.churn(4)
        wait_for(lambda: status(sb_metrics)["standby"]["last_seq"] == 6, what="the real standby to go on")
        assert status(act_metrics)["replication"]["sync_attached"]
        gateway.close()
    finally:
        sb.stop()
        act.stop()


class Churn(threading.Thread):
    """A gateway making events until its core dies (or ``stop``)."""

    def __init__(self, port: int, prefix: str) -> None:
        super().__init__(daemon=True)
        self.gateway, self.prefix = Gateway(port), prefix
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            while not self.stop.wait(0.005):
                self.gateway.churn(4, prefix=self.prefix)
        except OSError:
            pass


def test_failovers_lose_no_durable_event(tmp_path: Path) -> None:
    """SIGKILL the leader mid-stream, promote its sync standby by hand (a restart on its directory), bring the
    old leader back as the new one's standby (re-synced if it diverged); IDLED_FAILOVERS times (default 3).
    Every event a durable observer of a leader saw must be in the next leader's log, as it saw it."""
    failovers = int(os.environ.get("IDLED_FAILOVERS", "3"))
    dirs = [tmp_path / "x", tmp_path / "y"]
    leader, metrics = sync_active(dirs[0])
    follower, _ = standby(dirs[1], leader, "--fsync", "always")
    lost = checked = resyncs = 0
    try:
        for round_ in range(failovers):
            wait_for(lambda port=metrics: status(port)["replication"]["sync_attached"], what="a synchronous standby")
            durable = Watcher(leader.port, durable=True)
            churn = Churn(leader.port, f"r{round_}-")
            wait_for(lambda watcher=durable: watcher.last > 40, what="durable events")
            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait()
            churn.stop.set()
            churn.join()
            durable.close()
            follower.stop()  # promotion by hand: stop the standby, start the active role on its directory
            dirs.reverse()
            ours = {seq: (record["kind"], record["uid"]) for seq, record in decoded(dirs[0] / "data").items()}
            missing = [(seq, kind, uid) for seq, kind, uid in durable.seen if ours.get(seq) != (kind, uid)]
            lost += len(missing)
            checked += len(durable.seen)
            leader, metrics = sync_active(dirs[0])
            follower, follower_metrics = standby(dirs[1], leader, "--fsync", "always")
            wait_for(lambda port=follower_metrics: status(port)["standby"]["connected"]
                     and status(port)["standby"]["lag_records"] == 0, what="the old leader back, caught up")
            resyncs += "standby: diverged from the active" in follower.stderr()
        assert lost == 0 and checked > 40 * failovers, (lost, checked)
        print(f"{failovers} failovers: {checked} durable events checked, {lost} lost; {resyncs} diverged re-syncs")
    finally:
        follower.stop()
        leader.stop()


def decoded(data_dir: Path) -> dict[int, dict[str, Any]]:
    return {seq: decode_raw([raw])[0] for seq, raw in records(data_dir).items()}
