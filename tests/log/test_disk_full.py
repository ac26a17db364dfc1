"""A full disk at the log layer: appends that find no room change nothing but what they say they wrote, the
writer holds what it could not write and writes it in seq order once there is room, and nothing that has to
write (a torn tail's quarantine, the seq reservation, a snapshot) is left half done.

Most tests inject ENOSPC (tests/fulldisk.py); the last one fills a real tmpfs."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import DiskFull, EventLog, FsyncFailed, iter_records, list_segments
from idled.log.seqs import RESERVATION_NAME, SeqReservation
from idled.log.snapshot import list_snapshots, write_snapshot
from idled.log.writer import Held, run_writer
from tests import peers
from tests.fulldisk import FullDisk
from tests.log.test_writer import ev


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    return FullDisk(monkeypatch)


def open_log(directory: Path, **kwargs: Any) -> EventLog:
    log = EventLog(directory, **kwargs)
    log.recover()
    return log


def seqs_on_disk(directory: Path) -> list[int]:
    return [record["seq"] for record in iter_records(directory)]


def sizes(directory: Path) -> list[int]:
    return [os.path.getsize(path) for _, path in list_segments(directory)]


@pytest.mark.parametrize("reserve_ahead", [1 << 20, 0], ids=["reserving", "not-reserving"])
def test_an_append_that_finds_no_room_changes_nothing_and_can_be_tried_again(
    tmp_path: Path, disk: FullDisk, reserve_ahead: int
) -> None:
    # Reserving, the reservation fails before anything is written; not reserving (a file system without
    # fallocate), the write itself fails half-way and is cut back.
    disk.partial = 7
    with open_log(tmp_path, reserve_ahead=reserve_ahead) as log:
        log.append([ev(1), ev(2)])
        before = sizes(tmp_path)
        disk.full = True
        if reserve_ahead:
            log._space.reserved = 0  # (the first append reserved ahead: the next one must ask again)
        with pytest.raises(DiskFull) as failed:
            log.append([ev(3), ev(4)])
        assert failed.value.code == "disk_full" and "No space left on device" in failed.value.reason
        assert isinstance(failed.value.__cause__, OSError) and failed.value.__cause__.errno == errno.ENOSPC
        assert log.last_seq == 2 and failed.value.written == 0
        assert sizes(tmp_path) == before  # no torn record, no partial bytes
        assert seqs_on_disk(tmp_path) == [1, 2]
        disk.full = False
        log.append([ev(3), ev(4)])
        log.sync()
    assert seqs_on_disk(tmp_path) == [1, 2, 3, 4]


def test_a_batch_cut_by_a_full_disk_at_a_roll_keeps_what_was_written(tmp_path: Path, disk: FullDisk) -> None:
    with open_log(tmp_path, segment_bytes=600, reserve_ahead=1 << 20) as log:
        log.append([ev(1)])
        batch = [ev(seq) for seq in range(2, 12)]  # crosses into a new segment, whose reservation fails
        real_roll = log._roll

        def roll_then_fill(first_seq: int) -> bool:
            rolled = real_roll(first_seq)
            disk.full = True
            return rolled

        log._roll = roll_then_fill  # type: ignore[method-assign]
        with pytest.raises(DiskFull) as failed:
            log.append(batch)
        written = log.last_seq
        assert 1 < written < 11 and failed.value.written > 0
        assert seqs_on_disk(tmp_path) == list(range(1, written + 1))
        disk.full = False
        log._roll = real_roll  # type: ignore[method-assign]
        log.append([event for event in batch if event["seq"] > written])
    assert seqs_on_disk(tmp_path) == list(range(1, 12))


def test_space_is_reserved_ahead_without_changing_the_file_size_and_given_back_at_close(tmp_path: Path) -> None:
    log = open_log(tmp_path, reserve_ahead=1 << 20)
    written = log.append([ev(seq) for seq in range(1, 6)])
    path = log.active_path
    assert path is not None
    st = os.stat(path)
    assert st.st_size == written  # readers and recovery see the records, nothing more
    assert st.st_blocks * 512 >= 1 << 20  # ... while the blocks are taken ahead
    log.close()
    assert os.stat(path).st_blocks * 512 < 1 << 20  # given back
    assert seqs_on_disk(tmp_path) == [1, 2, 3, 4, 5]


def test_small_batches_need_no_fallocate_once_the_writer_thread_reserved_ahead(tmp_path: Path) -> None:
    with open_log(tmp_path, reserve_ahead=16 << 20) as log:
        assert not log.fits(1)  # nothing reserved yet: the first batch goes to the thread
        log.append([ev(1)])
        log.reserve_ahead()
        calls = log._space.fallocates
        seq = 2
        while log.fits(64):
            log.append([ev(seq)])
            seq += 1
        assert log._space.fallocates == calls and seq > 1000  # inline appends never reserved


def test_a_torn_tail_on_a_full_disk_waits_for_room_to_be_quarantined(tmp_path: Path, disk: FullDisk) -> None:
    with open_log(tmp_path) as log:
        log.append([ev(1), ev(2)])
    segment = list_segments(tmp_path)[-1][1]
    with open(segment, "ab") as file:
        file.write(b"\x01\x02torn")
    disk.full = True
    log = open_log(tmp_path)  # recovery needs no room
    assert log.last_seq == 2 and not list(tmp_path.glob("*.quarantine-*"))
    with pytest.raises(DiskFull):
        log.append([ev(3)])  # would land after the garbage: refused until it can be quarantined
    assert not list(tmp_path.glob("*.quarantine-*"))  # no half copy left taking space
    disk.full = False
    log.append([ev(3)])
    log.close()
    (quarantined,) = tmp_path.glob("*.quarantine-*")
    assert quarantined.read_bytes() == b"\x01\x02torn"
    assert seqs_on_disk(tmp_path) == [1, 2, 3]


def test_a_seq_mark_that_cannot_be_written_stays_as_it_was(tmp_path: Path, disk: FullDisk) -> None:
    reservation = SeqReservation(tmp_path)
    reservation.record(1000)
    disk.full = True
    with pytest.raises(OSError) as failed:
        reservation.record(2000)
    assert failed.value.errno == errno.ENOSPC
    assert reservation.load() == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESERVATION_NAME]  # no temporary file left


def test_a_snapshot_that_cannot_be_written_leaves_nothing_behind(tmp_path: Path, disk: FullDisk) -> None:
    disk.full = True
    with pytest.raises(OSError):
        write_snapshot(str(tmp_path), 10, {"u1": complex(1.0, 30.0)})
    assert list(tmp_path.iterdir()) == [] and list_snapshots(str(tmp_path)) == []


class Report:
    """run_writer's callbacks, checked as they come: durable never ahead of the disk, degraded reported once."""

    def __init__(self, log: EventLog, directory: Path) -> None:
        self.log, self.directory = log, directory
        self.durable: list[int] = []
        self.degraded: list[str | None] = []

    def on_durable(self, seq: int) -> None:
        assert seq in seqs_on_disk(self.directory)  # (durable under the policy: synced, or written for never)
        self.durable.append(seq)

    def on_degraded(self, exc: DiskFull | None) -> None:
        self.degraded.append(None if exc is None else exc.reason)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_the_writer_holds_what_a_full_disk_refused_and_writes_it_in_order_by_itself(
    tmp_path: Path, disk: FullDisk, autojump_clock: trio.abc.Clock, policy: str
) -> None:
    log = open_log(tmp_path, reserve_ahead=0)
    report, held = Report(log, tmp_path), Held()
    send, receive = trio.open_memory_channel[dict[str, Any]](1000)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_writer(
            log, receive, fsync=policy, interval=0.5, on_durable=report.on_durable, on_degraded=report.on_degraded,
            held=held, task_status=task_status))
        for seq in range(1, 11):
            await send.send(ev(seq))
        await trio.sleep(1)
        disk.full = True
        for seq in range(11, 21):
            await send.send(ev(seq))
        await trio.sleep(5)  # five retries, all refused
        assert held.reason is not None and "No space left on device" in held.reason
        assert held.attempts >= 5 and report.degraded == [held.reason]  # reported once, not per retry
        assert 1 <= held.events <= 10 and held.events + receive.statistics().current_buffer_used == 10
        assert seqs_on_disk(tmp_path) == list(range(1, 11))  # the log stays at its last whole record
        assert report.durable[-1] == 10  # what was written before is durable, and reported so
        for seq in range(21, 31):
            await send.send(ev(seq))  # still accepted, in order, behind the held ones
        disk.full = False
        await trio.sleep(2)
        assert report.degraded == [report.degraded[0], None] and held.reason is None and held.events == 0
        await send.aclose()
    log.close()
    assert seqs_on_disk(tmp_path) == list(range(1, 31))  # no gap, no duplicate, in seq order
    assert report.durable == sorted(report.durable) and report.durable[-1] == 30


async def test_a_failed_fsync_on_a_full_disk_stays_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)

    def no_room(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # e.g. NFS reports a full disk at fsync

    monkeypatch.setattr(os, "fdatasync", no_room)
    send, receive = trio.open_memory_channel[dict[str, Any]](10)
    await send.send(ev(1))
    await send.aclose()
    with pytest.raises(FsyncFailed):
        await run_writer(log, receive, fsync="always")
    log.close()


@pytest.mark.slow
def test_a_real_full_tmpfs_refuses_appends_whole_and_takes_them_once_there_is_room(tmp_path: Path) -> None:
    with peers.small_tmpfs(tmp_path, "256k") as mount_point:
        directory = mount_point / "log"
        log = open_log(directory)
        seq = 0
        with pytest.raises(DiskFull):
            while True:
                log.append([ev(seq + 1), ev(seq + 2)])
                seq += 2
        assert log.last_seq in (seq, seq + 1)
        log.sync()
        assert seqs_on_disk(directory) == list(range(1, log.last_seq + 1))  # whole records only
        # room again (nothing to delete here but the log itself: the tmpfs grows)
        subprocess.run(["mount", "-o", "remount,size=1m", str(mount_point)], check=True)
        last = log.last_seq
        log.append([ev(last + 1), ev(last + 2)])
        log.close()
        assert seqs_on_disk(directory) == list(range(1, last + 3))
