"""Tests for idled.log.writer.run_writer on a real directory (pytest-trio; autojump clock where time matters)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import EventLog, FsyncFailed, iter_records, list_segments
from idled.log.writer import run_writer


def ev(seq: int) -> dict[str, Any]:
    ts = 1_700_000_000.0 + seq
    return {
        "seq": seq, "kind": "online" if seq % 2 else "offline", "uid": f"u{seq % 5}", "ts": ts, "reason": "login",
        "last_seen": ts, "deadline": ts + 45.0, "timeout": 45.0, "detector": "wheel",
    }


class Recorder:
    """Collects the writer's callbacks in order, checking durability claims against the log as they come."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.trace: list[tuple[str, Any]] = []
        self.durable: list[int] = []
        self.batches: list[tuple[int, int]] = []
        self.fsyncs: list[float] = []

    def on_durable(self, seq: int) -> None:
        self.durable.append(seq)
        self.trace.append(("durable", seq))

    def on_batch(self, records: int, nbytes: int) -> None:
        self.batches.append((records, nbytes))
        self.trace.append(("batch", records))

    def on_fsync(self, seconds: float) -> None:
        assert seconds >= 0
        self.fsyncs.append(seconds)
        self.trace.append(("fsync", seconds))

    def kwargs(self) -> dict[str, Any]:
        return {"on_durable": self.on_durable, "on_batch": self.on_batch, "on_fsync": self.on_fsync}


def open_log(directory: Path, **kwargs: Any) -> EventLog:
    log = EventLog(directory, **kwargs)
    log.recover()
    return log


async def write_all(log: EventLog, recorder: Recorder, policy: str, seqs: range, *, gap: float = 0.0,
                    channel: int = 16, **kwargs: Any) -> None:
    send, receive = trio.open_memory_channel[dict[str, Any]](channel)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_writer(
            log, receive, fsync=policy, task_status=task_status, **recorder.kwargs(), **kwargs))
        async with send:
            for seq in seqs:
                await send.send(ev(seq))
                if gap:
                    await trio.sleep(gap)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_every_policy_writes_everything_and_reports_the_last_seq(tmp_path: Path, policy: str) -> None:
    log = open_log(tmp_path, segment_bytes=2000)  # rotations on the way
    recorder = Recorder(log)
    await write_all(log, recorder, policy, range(1, 301))
    log.close()
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, 301))
    assert len(list_segments(tmp_path)) > 3
    assert recorder.durable[-1] == 300
    assert recorder.durable == sorted(recorder.durable)
    assert sum(n for n, _ in recorder.batches) == 300
    assert sum(b for _, b in recorder.batches) == sum(os.path.getsize(p) for _, p in list_segments(tmp_path))
    if policy == "never":
        assert recorder.fsyncs == []
    else:
        assert recorder.fsyncs


async def test_always_reports_durable_only_after_the_batch_is_synced(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    seen: list[tuple[int, int]] = []

    class Checking(Recorder):
        def on_durable(self, seq: int) -> None:
            seen.append((seq, log.durable_seq))  # durable_seq moves only when fdatasync has returned
            super().on_durable(seq)

    recorder = Checking(log)
    await write_all(log, recorder, "always", range(1, 201), channel=8)
    log.close()
    assert all(durable >= seq for seq, durable in seen)
    assert len(recorder.fsyncs) == len(recorder.batches)  # one fdatasync per batch
    # every batch is followed by its fsync and then its durable report, never the other way round
    kinds = [kind for kind, _ in recorder.trace]
    assert kinds == ["batch", "fsync", "durable"] * len(recorder.batches)
    assert recorder.durable[-1] == 200


async def test_group_commit_batches_what_queued_while_the_disk_was_busy(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    recorder = Recorder(log)
    send, receive = trio.open_memory_channel[dict[str, Any]](1000)
    for seq in range(1, 501):
        send.send_nowait(ev(seq))  # all queued before the writer starts
    await send.aclose()
    await run_writer(log, receive, fsync="always", max_batch=200, **recorder.kwargs())
    log.close()
    assert [n for n, _ in recorder.batches] == [200, 200, 100]
    assert len(recorder.fsyncs) == 3


async def test_interval_syncs_pending_data_when_traffic_stops(tmp_path: Path) -> None:
    # Real time (the autojump clock would jump past the worker thread doing the sync): a 0.5 s interval,
    # and a bounded wait for the writer to sync on its own.
    log = open_log(tmp_path)
    reached = trio.Event()
    times: dict[int, float] = {}

    class Waiting(Recorder):
        def on_durable(self, seq: int) -> None:
            super().on_durable(seq)
            times[seq] = trio.current_time()
            if seq == 5:
                reached.set()

    recorder = Waiting(log)
    send, receive = trio.open_memory_channel[dict[str, Any]](16)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_writer(
            log, receive, fsync="interval", interval=0.5, task_status=task_status, **recorder.kwargs()))
        started = trio.current_time()
        for seq in range(1, 6):
            await send.send(ev(seq))  # 1 is synced at once, 2..5 (within the interval) are left dirty
        with trio.fail_after(10):
            await reached.wait()  # no more traffic, and still the writer syncs them
        assert log.durable_seq == 5
        first_batch = recorder.batches[0][0]
        assert first_batch < 5
        assert recorder.trace[:3] == [("batch", first_batch), ("fsync", recorder.fsyncs[0]), ("durable", first_batch)]
        # ...but not before the interval since the first sync had passed
        assert times[5] >= started + 0.5
        await send.aclose()
    log.close()


async def test_interval_syncs_a_burst_once_not_per_batch(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    # The sender never sleeps, so no virtual time passes: group commits keep coming within one interval.
    log = open_log(tmp_path)
    recorder = Recorder(log)
    await write_all(log, recorder, "interval", range(1, 201), channel=16, interval=1.0)
    log.close()
    assert len(recorder.batches) >= 200 // 16
    assert len(recorder.fsyncs) == 2  # the first batch, then the final sync when the channel closed
    assert recorder.durable == [recorder.batches[0][0], 200]
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, 201))


async def test_interval_limits_fsync_rate(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    log = open_log(tmp_path)
    recorder = Recorder(log)
    started = trio.current_time()
    await write_all(log, recorder, "interval", range(1, 101), gap=0.1, interval=1.0)  # ~10 s of traffic
    elapsed = trio.current_time() - started
    log.close()
    # (how events group into batches varies: the autojump clock may jump while a worker thread writes)
    assert len(recorder.fsyncs) <= elapsed / 1.0 + 2  # at most one per interval, plus the first and the last
    assert recorder.durable[-1] == 100
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, 101))


async def test_never_reports_written_seqs_without_fsync(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    log = open_log(tmp_path, segment_bytes=500)
    recorder = Recorder(log)
    await write_all(log, recorder, "never", range(1, 41), gap=0.5)
    assert recorder.fsyncs == []
    assert log.durable_seq == 0
    assert recorder.durable[-1] == 40
    assert recorder.durable == sorted(recorder.durable)
    log.close()


async def test_fsync_failure_propagates_and_closes_the_channel(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append([ev(1)])
    reader, writer = os.pipe()
    os.dup2(writer, log._fd)  # type: ignore[arg-type]  # fdatasync on a pipe fails (EINVAL)
    os.close(writer)
    send, receive = trio.open_memory_channel[dict[str, Any]](4)
    try:
        with pytest.RaisesGroup(FsyncFailed):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: run_writer(log, receive, fsync="always"))
                await send.send(ev(2))
                await trio.sleep_forever()  # cancelled when the writer fails
    finally:
        log.close()
        os.close(reader)
    with pytest.raises(trio.BrokenResourceError):
        send.send_nowait(ev(3))  # the dead writer closed its end: senders are not left blocked


async def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _send, receive = trio.open_memory_channel[dict[str, Any]](1)
    for kwargs in ({"fsync": "sometimes"}, {"interval": 0}, {"interval": float("inf")}, {"max_batch": 0}):
        with pytest.raises(ValueError):
            await run_writer(log, receive, **kwargs)
    log.close()


async def test_before_write_raising_ends_the_writer_with_nothing_of_that_batch_written(tmp_path: Path) -> None:
    # An elected core's fence (idled.server.election.fence): once leadership is gone, not one more batch is written.
    log = open_log(tmp_path)
    leading = True

    class Fenced(Exception):
        pass

    def fence() -> None:
        if not leading:
            raise Fenced

    send, receive = trio.open_memory_channel[dict[str, Any]](100)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_writer(
                log, receive, fsync="always", before_write=fence, task_status=task_status))
            for seq in range(1, 11):
                await send.send(ev(seq))
            while log.last_seq < 10:
                await trio.sleep(0.01)
            leading = False
            send.send_nowait(ev(11))
            await trio.sleep(5)  # cancelled when the writer ends
    assert caught.group_contains(Fenced)
    log.close()
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, 11))
