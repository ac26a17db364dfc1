"""Restart after a SIGKILL with 200,000 sessions left online: the `restart` burst is bounded (issue 24, item 5).

Run 1 (`idled serve`) gets 200,000 sessions through one gateway and is SIGKILLed once they are logged. Run 2
recovers them and must close each with one `restart` offline before it listens. Through the same bounded,
chunked path as every other burst (``Sessions.end_recovered``: the writer's backlog limit, the seq
headroom, a checkpoint per chunk), and with recovery keeping each session compact, that costs less memory
than run 1 held at its peak, stalls the loop
for no second (the stall guard logs any pause past its limit: a second here), and leaves every `restart`
in the log, in contiguous seqs, ts never going backwards. Once, all 200,000 were published in one loop
step: "event loop could not run for 2.505 s" and a peak RSS of 293 MB against 163 MB before the kill.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import Attach
from tests import peers

pytestmark = pytest.mark.slow  # real `idled serve` subprocesses, 200,000 sessions

SESSIONS = 200_000
FRAME_UIDS = 50_000  # uids per attach frame (~250 KB: under the gateway frame limit)
# Run 2's peak RSS over run 1's. Measured 0.73; 1.70 with the burst in one step and recovery holding every
# session's full record, 1.38 with only the burst bounded.
RSS_RATIO = 1.0


class Daemon(peers.Daemon):
    def __init__(self, tmp_path: Path, run: int) -> None:
        self.data_dir = tmp_path / "data"
        self.metrics_port = peers.free_port()
        # tick 0.5 s, stall_ticks 2: the stall guard logs any pause of the loop past 1 s
        command = peers.serve_command(self.data_dir, "--metrics-port", str(self.metrics_port), "--tick", "0.5",
                                      "--stall-ticks", "2", "--max-connections", "100")
        super().__init__(command, tmp_path / f"run-{run}.stderr", timeout=60.0)

    def records_written(self) -> int:
        return int(peers.scrape(self.metrics_port, "idled_eventlog_records_total"))

    async def written(self, count: int, timeout: float = 40.0) -> None:
        with trio.fail_after(timeout):
            while await trio.to_thread.run_sync(self.records_written) < count:
                await trio.sleep(0.1)

    def peak_rss(self) -> int:
        """VmHWM: the most resident memory the process ever had, in kB."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        raise AssertionError("no VmHWM")


async def test_restart_of_200k_sessions_is_bounded_and_complete(tmp_path: Path) -> None:
    started = time.monotonic()
    first = Daemon(tmp_path, 1)
    try:
        port = await first.started()
        gateway = await peers.Client.login(port, "gateway", "gw")
        for start in range(0, SESSIONS, FRAME_UIDS):
            await gateway.send(Attach(tuple(range(start, start + FRAME_UIDS)), 1000.0))  # no expiry in the test
        await first.written(SESSIONS)
        peak_before = first.peak_rss()
    finally:
        first.kill()
    on_disk = list(iter_records(tmp_path / "data"))
    assert len(on_disk) == SESSIONS and all(r["kind"] == "online" for r in on_disk)
    mark = int((tmp_path / "data" / "seq-reserved").read_text())

    second = Daemon(tmp_path, 2)
    try:
        await second.started()  # the restart records are all published before it listens
        await second.written(SESSIONS)
        peak_after = second.peak_rss()
        assert await second.stop(signal.SIGTERM) == 0
    finally:
        second.kill()
    stderr = second.stderr()
    print(f"peak RSS: {peak_before} kB before the kill, {peak_after} kB after the restart "
          f"({peak_after / peak_before:.2f}x); {time.monotonic() - started:.1f} s")

    assert f"closed {SESSIONS} sessions left online by the previous run" in stderr, stderr[-2000:]
    assert "event loop could not run" not in stderr, stderr[-2000:]
    assert "Traceback" not in stderr
    assert peak_after < RSS_RATIO * peak_before, (peak_before, peak_after)
    records = list(iter_records(tmp_path / "data"))
    assert records[:SESSIONS] == on_disk
    restarts = records[SESSIONS:]
    # every session closed once, as restart, in seqs that carry on right after the killed run's reservation
    assert [r["seq"] for r in restarts] == list(range(mark + 1, mark + 1 + SESSIONS))
    assert all((r["kind"], r["reason"]) == ("offline", "restart") for r in restarts)
    assert sorted(r["uid"] for r in restarts) == list(range(SESSIONS))
    stamps = [r["ts"] for r in records]
    assert stamps == sorted(stamps)
