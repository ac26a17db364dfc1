"""A segment roll never fails for lack of descriptors: a real RLIMIT_NOFILE squeeze in a subprocess.

The child lowers its open-file limit, recovers a log, then opens /dev/null until EMFILE -- every slot taken,
as under `prlimit --nofile=600` with many connections -- and appends batches that force roll after roll,
syncing (or, like fsync=never, releasing) between them. It reports what happened as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from idled.log.eventlog import iter_records, list_segments
from idled.log.snapshot import list_snapshots

CHILD = textwrap.dedent(
    """
    import errno, json, os, resource, sys
    from idled.log.eventlog import EventLog

    directory, mode, per_batch, retention = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    def ev(seq):
        return {"seq": seq, "kind": "online" if seq % 3 else "offline", "uid": f"u{seq % 7}", "ts": 1.0 * seq,
                "reason": "login", "last_seen": 1.0 * seq, "timeout": 45.0}

    log = EventLog(directory, segment_bytes=400, retention_bytes=retention)
    log.recover()
    hogs = []
    while True:
        try:
            hogs.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            break
    seq = 1
    for _ in range(40):
        log.append([ev(s) for s in range(seq, seq + per_batch)])
        seq += per_batch
        if mode == "sync":
            log.sync()
        else:
            log.release_rotated()
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
        squeezed = False
    except OSError:
        squeezed = True
    for fd in hogs:
        os.close(fd)
    waited = log.snapshot_failures + log.retention_deferred
    log.append([ev(seq)])  # descriptors free again: the next roll or retention catches up
    seq += 1
    log.append([ev(s) for s in range(seq, seq + 4)])
    seq += 4
    log.sync()
    print(json.dumps({
        "last": seq - 1, "squeezed": squeezed, "hogs": len(hogs), "rotations": log.rotations,
        "deferred": log.deferred_rolls, "spare_failures": log.spare_failures,
        "retention_waited": waited, "snapshots": log.snapshots,
    }))
    log.close()
    """
)


def squeeze(directory: Path, mode: str, per_batch: int, retention: int = 1 << 30) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), mode, str(per_batch), str(retention)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["squeezed"] and report["hogs"] > 0  # the appends really ran with no descriptor to spare
    return report


@pytest.mark.parametrize("mode", ["sync", "never"])
def test_every_roll_happens_with_no_free_descriptor(tmp_path: Path, mode: str) -> None:
    report = squeeze(tmp_path, mode, per_batch=4)  # 4 records (98 B each) fill a 400 B segment: a roll a batch
    assert report["rotations"] >= 40 and report["deferred"] == 0
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, report["last"] + 1))
    assert len(list_segments(tmp_path)) >= 40


def test_a_batch_needing_several_rolls_defers_the_extra_ones_instead_of_failing(tmp_path: Path) -> None:
    report = squeeze(tmp_path, "sync", per_batch=12)  # ~4 segments' worth per batch, one spare per sync
    assert report["deferred"] > 0  # the roll waited: the batch went on into the active segment
    assert report["rotations"] >= 40
    assert [r["seq"] for r in iter_records(tmp_path)] == list(range(1, report["last"] + 1))


def test_retention_waits_for_a_snapshot_it_cannot_write_under_the_squeeze(tmp_path: Path) -> None:
    report = squeeze(tmp_path, "sync", per_batch=4, retention=2000)
    assert report["retention_waited"] > 0  # no descriptor to list the directory or write a snapshot
    assert report["snapshots"] >= 1 and list_snapshots(tmp_path)  # written once descriptors were back
    records = [r["seq"] for r in iter_records(tmp_path)]
    assert records == list(range(records[0], report["last"] + 1)) and records[0] > 1  # retention then ran
