"""A standby core (`idled serve --standby-of`): real daemons on loopback (docs/ha.md)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.protocol import Login
from tests import peers
from tests.server.ha.standby_support import (
    Gateway, active, login_error, observe, records, standby, status, wait_for,
)

pytestmark = pytest.mark.slow


def caught_up(metrics_port: int, last_seq: int) -> bool:
    return bool(status(metrics_port)["standby"]["last_seq"] >= last_seq)


def last_seq(data_dir: Path) -> int:
    return max(records(data_dir), default=0)


def test_replicates_byte_identical_and_serves_reads(tmp_path: Path) -> None:
    with active(tmp_path / "a", "--fsync", "always") as act:
        sb, metrics = standby(tmp_path / "s", act)
        with sb:
            gateway = Gateway(act.port)
            for _ in range(20):
                gateway.churn(10)
            wait_for(lambda: last_seq(tmp_path / "a/data") == 300, what="the active's records")
            wait_for(lambda: caught_up(metrics, 300), what="the standby to catch up")
            assert records(tmp_path / "a/data") == records(tmp_path / "s/data")
            # Observers on both see the same events with the same seqs.
            assert observe(sb.port, 1, 300) == observe(act.port, 1, 300)
            doc = status(metrics)["standby"]
            assert doc["connected"] and doc["lag_records"] == 0 and doc["state"] == "streaming"
            for login in (Login("uid", "bob"), Login("gateway", "edge-1")):
                reply = login_error(sb.port, login)
                assert b"not_leader" in reply and f"127.0.0.1:{act.port}".encode() in reply
            gateway.close()
            act.stop()  # first: a clean stop sends the standby every record before server_shutdown
            final = last_seq(tmp_path / "a/data")
            wait_for(lambda: caught_up(metrics, final), what="the shutdown's records")
    segments = sorted(p.name for p in (tmp_path / "a/data").glob("*.seg"))
    assert segments == sorted(p.name for p in (tmp_path / "s/data").glob("*.seg"))
    for name in segments:
        assert (tmp_path / "a/data" / name).read_bytes() == (tmp_path / "s/data" / name).read_bytes()


def test_resumes_after_standby_sigkill_and_active_restart(tmp_path: Path) -> None:
    act = active(tmp_path / "a", "--fsync", "always")
    sb, metrics = standby(tmp_path / "s", act)
    try:
        gateway = Gateway(act.port)
        for _ in range(10):
            gateway.churn(10)
        wait_for(lambda: caught_up(metrics, 150), what="first catch-up")
        sb.proc.send_signal(signal.SIGKILL)
        sb.proc.wait()
        for _ in range(10):
            gateway.churn(10, prefix="v")
        sb, metrics = standby(tmp_path / "s", act)
        wait_for(lambda: caught_up(metrics, 300), what="catch-up after the standby's SIGKILL")
        gateway.close()
        port = act.port
        act.stop()  # a clean restart of the active on the same port: the standby reconnects
        expected = last_seq(tmp_path / "a/data")
        act = active(tmp_path / "a", "--fsync", "always", "--port", str(port))
        # Kept open to the end: a gateway closed here would have its sessions end later (gateway_lost, after
        # the core's hold), after `final` was read -- CI saw those 5 offlines arrive in between.
        late = Gateway(act.port)
        late.churn(10, prefix="w")
        wait_for(lambda: last_seq(tmp_path / "a/data") >= expected + 15, what="the restarted active's events")
        final = last_seq(tmp_path / "a/data")
        wait_for(lambda: caught_up(metrics, final), timeout=20, what="catch-up after the active's restart")
        ours, theirs = records(tmp_path / "s/data"), records(tmp_path / "a/data")
        assert ours == theirs  # no gap, no duplicate (records() asserts each seq once)
        assert sorted(ours) == list(range(1, final + 1))
        late.close()
    finally:
        sb.stop()
        act.stop()


def test_durable_only_under_fsync_interval(tmp_path: Path) -> None:
    with active(tmp_path / "a", "--fsync", "interval", "--fsync-interval", "4") as act:
        sb, metrics = standby(tmp_path / "s", act)
        with sb:
            gateway = Gateway(act.port)
            gateway.churn(2)  # the first batch after a quiet spell is synced at once
            wait_for(lambda: caught_up(metrics, 3), what="the first synced batch")
            time.sleep(0.2)
            for _ in range(5):
                gateway.churn(10)  # written, not synced for up to 4 s
            wait_for(lambda: last_seq(tmp_path / "a/data") == 78, what="the active's writes")
            time.sleep(1.0)
            held = status(metrics)["standby"]["last_seq"]
            assert held < 78, "the standby holds records the active has not synced"
            wait_for(lambda: caught_up(metrics, 78), timeout=10, what="the active's next sync to ship")
            gateway.close()


def test_resync_after_falling_behind_retention(tmp_path: Path) -> None:
    small = ("--segment-bytes", "4096", "--retention-bytes", "8192", "--fsync", "always")
    with active(tmp_path / "a", *small) as act:
        sb, metrics = standby(tmp_path / "s", act, *small)
        gateway = Gateway(act.port)
        gateway.churn(4)  # two users stay online through the whole test
        with sb:
            wait_for(lambda: caught_up(metrics, 6), what="first catch-up")
        for _ in range(40):
            gateway.churn(10, prefix="r")
            time.sleep(0.01)
        wait_for(lambda: last_seq(tmp_path / "a/data") == 606, what="the active's events")
        assert min(records(tmp_path / "a/data")) > 7, "the active's retention has not dropped what the standby has"
        sb, metrics = standby(tmp_path / "s", act, *small)
        with sb:
            wait_for(lambda: caught_up(metrics, 606), what="the re-synced standby to catch up")
            assert "behind the active's retention" in sb.stderr() and "starting over from seq" in sb.stderr()
            asides = list((tmp_path / "s/data").glob("aside-*"))
            assert len(asides) == 1 and list(asides[0].glob("*.seg")), "the old log was not moved aside"
            ours, theirs = records(tmp_path / "s/data"), records(tmp_path / "a/data")
            assert {seq: raw for seq, raw in ours.items() if seq in theirs} == theirs
            assert status(metrics)["standby"]["resyncs"] == 1
        gateway.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with peers.small_tmpfs(tmp_path, "256k") as mount_point:
        yield mount_point


def test_standby_disk_full_stops_replication_not_the_active(tmp_path: Path, small_disk: Path) -> None:
    with active(tmp_path / "a", "--fsync", "always") as act:
        sb, metrics = standby(tmp_path / "s", act, "--segment-bytes", "65536", "--data-dir", str(small_disk / "data"))
        with sb:
            stat = os.statvfs(small_disk)
            with open(small_disk / "filler", "wb") as filler:
                filler.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - 96 * 1024))
            gateway = Gateway(act.port)
            for _ in range(200):
                gateway.churn(10)
            wait_for(lambda: "cannot write the replicated log" in sb.stderr(), what="the standby's error line")
            assert status(metrics)["standby"]["error"].startswith("cannot write the replicated log")
            # The active goes on: more events, all written.
            gateway.churn(10, prefix="after")
            wait_for(lambda: last_seq(tmp_path / "a/data") == 3015, what="the active to go on")
            assert act.proc.poll() is None and sb.proc.poll() is None
            gateway.close()
