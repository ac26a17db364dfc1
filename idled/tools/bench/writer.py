"""`idled bench --writer`: the event-log writer's throughput and latency under each fsync policy.

Each run feeds `run_writer` fresh offline events for a fixed time on a real directory -- per event (a
schedule point each, like events from many connection tasks) or in bursts (a tick expiring many sessions)
-- and reports durable events/s, batch sizes, fsync latency, and how fast `recover()` reads the log back.
A "no disk" run per producer measures the producer against a consumer that only drains: the ceiling of the
measurement itself.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import trio

from idled.log.eventlog import EventLog
from idled.log.writer import FSYNC_POLICIES, run_writer

__all__ = ["bench_writer", "report_lines"]


def _event(seq: int, now: float) -> dict[str, Any]:
    """A realistic offline event (137 bytes framed)."""
    return {
        "seq": seq,
        "kind": "offline",
        "uid": f"user-{seq * 7919 % 1_000_003:07d}",
        "ts": now,
        "reason": "idle",
        "last_seen": now - 45.0,
        "deadline": now,
        "timeout": 45.0,
        "detector": "wheel",
    }


async def _produce(send: trio.MemorySendChannel[dict[str, Any]], seconds: float, burst: bool) -> int:
    """Send fresh events for `seconds`; return how many. Closes `send`.

    burst=False: `await send()` per event, a schedule point each, like events coming from many connection
    tasks. burst=True: `send_nowait` until the channel is full, like a tick expiring many sessions at once;
    this shows what the writer itself sustains.
    """
    seq = 0
    deadline = time.perf_counter() + seconds
    async with send:
        while time.perf_counter() < deadline:
            now = time.time()
            for _ in range(100):
                seq += 1
                event = _event(seq, now)
                if burst:
                    try:
                        send.send_nowait(event)
                        continue
                    except trio.WouldBlock:
                        pass
                await send.send(event)
            if burst:
                await trio.lowlevel.checkpoint()
    return seq


async def _bench_no_disk(seconds: float, channel_size: int, burst: bool) -> dict[str, float]:
    """The producer against a consumer that only drains: the ceiling of the measurement itself."""
    send, receive = trio.open_memory_channel[dict[str, Any]](channel_size)

    async def drain() -> None:  # takes what is queued in one go, as run_writer does
        async with receive:
            while True:
                try:
                    await receive.receive()
                except trio.EndOfChannel:
                    return
                while True:
                    try:
                        receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        started = time.perf_counter()
        count = await _produce(send, seconds, burst)
    return {"events_per_s": count / (time.perf_counter() - started)}


async def _bench_one(directory: str, policy: str, burst: bool, seconds: float, channel_size: int) -> dict[str, float]:
    log = EventLog(directory)
    log.recover()
    send, receive = trio.open_memory_channel[dict[str, Any]](channel_size)
    batches: list[int] = []
    fsyncs: list[float] = []
    written = [0]
    durable = [0]

    def on_batch(records: int, nbytes: int) -> None:
        batches.append(records)
        written[0] += nbytes

    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_writer(
                log, receive, fsync=policy, interval=1.0, on_batch=on_batch,
                on_fsync=fsyncs.append, on_durable=lambda seq: durable.__setitem__(0, seq), task_status=task_status,
            )
        )
        started = time.perf_counter()
        await _produce(send, seconds, burst)
        # closing the channel makes the writer drain, sync and return: included in the time
    elapsed = time.perf_counter() - started
    log.close()
    fsyncs.sort()
    size = _directory_bytes(directory)  # after the timed part: blocking here delays nothing measured
    recover_started = time.perf_counter()
    with EventLog(directory) as again:
        recovered = again.recover()
    recover_seconds = time.perf_counter() - recover_started
    return {
        "events_per_s": durable[0] / elapsed,
        "mib_per_s": written[0] / elapsed / 2**20,
        "batches": len(batches),
        "mean_batch": sum(batches) / max(1, len(batches)),
        "fsyncs": len(fsyncs),
        "fsync_p50_ms": fsyncs[len(fsyncs) // 2] * 1e3 if fsyncs else 0.0,
        "fsync_p99_ms": fsyncs[min(len(fsyncs) - 1, int(len(fsyncs) * 0.99))] * 1e3 if fsyncs else 0.0,
        "recover_records_per_s": recovered.records / recover_seconds,
        "recover_mib_per_s": size / recover_seconds / 2**20,
    }


def bench_writer(
    seconds: float = 3.0, channel_size: int = 8192, directory: str | None = None,
    policies: Sequence[str] = FSYNC_POLICIES,
) -> list[tuple[str, dict[str, float]]]:
    """Measure run_writer's sustained events/s per (producer, fsync policy) on a real directory, one run each."""
    return list(_each_run(seconds, directory, channel_size, policies))


def _each_run(
    seconds: float, directory: str | None, channel_size: int = 8192, policies: Sequence[str] = FSYNC_POLICIES
) -> Iterator[tuple[str, dict[str, float]]]:
    for burst in (False, True):
        producer = "burst" if burst else "per-event"
        yield f"{producer} no disk", trio.run(_bench_no_disk, seconds, channel_size, burst)
        for policy in policies:
            with tempfile.TemporaryDirectory(prefix="idled-bench-", dir=directory) as tmp:
                result = trio.run(_bench_one, tmp, policy, burst, seconds, channel_size)
            yield f"{producer} {policy}", result


def report_lines(seconds: float = 3.0, directory: str | None = None) -> Iterator[str]:
    """bench_writer's figures as text lines, each yielded as soon as its run is done."""
    yield (f"run_writer: {seconds:g} s per run, channel 8192, dir {directory or tempfile.gettempdir()}, "
           f"{os.cpu_count()} CPUs")
    for name, r in _each_run(seconds, directory):
        if name.endswith("no disk"):
            yield f"{name:>18}: {r['events_per_s']:>9,.0f} events/s (no writer: a consumer that only drains)"
            continue
        yield (
            f"{name:>18}: {r['events_per_s']:>9,.0f} events/s durable, {r['mib_per_s']:5.1f} MiB/s, "
            f"mean batch {r['mean_batch']:6,.0f}, {r['fsyncs']:5,.0f} fsyncs (p50 {r['fsync_p50_ms']:5.2f} ms, "
            f"p99 {r['fsync_p99_ms']:6.2f} ms); recover() {r['recover_records_per_s']:,.0f} records/s"
            f" = {r['recover_mib_per_s']:.1f} MiB/s"
        )


def _directory_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))
