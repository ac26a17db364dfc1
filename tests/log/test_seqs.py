"""The seq reservation file (idled.log.seqs) written by two threads at once: each write stays whole."""

from __future__ import annotations

import threading
from pathlib import Path

from idled.log.seqs import SeqReservation


def test_two_threads_recording_together_leave_one_whole_mark(tmp_path: Path) -> None:
    # The monitor's extension and the shutdown's final mark run in worker threads with nothing ordering them.
    # Unlocked, 499 of 500 such pairs raised FileNotFoundError (one renamed the temp file away under the other)
    # and 21 left "600\n000000", which load() rejects: the next start failed.
    reservation = SeqReservation(tmp_path)
    failures: list[BaseException] = []

    def write(upto: int, ready: threading.Barrier) -> None:
        ready.wait()
        try:
            reservation.record(upto)
        except Exception as exc:  # noqa: BLE001 -- collected: a thread's exception would otherwise be lost
            failures.append(exc)

    for round_ in range(500):
        ready = threading.Barrier(2)
        marks = (1_000_000 + round_, 600 + round_)
        threads = [threading.Thread(target=write, args=(mark, ready)) for mark in marks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures[:3]
        assert reservation.load() in marks
    assert not (tmp_path / "seq-reserved.tmp").exists()
