"""The paired path's two passes (`filepass`, `userpass`) in plain Python against the reference.

The passes run here exactly as the Spark job runs them (`pair_file` over each run of consecutive segment
files of a daemon, every carry of a uid into one `finish_user`, every lateness piece of a detector into one `finish_detector`), only without
Spark, so every table and count can be compared with `reference.compute` on many inputs: the generated and
crafted daemons, and random record streams cut into random files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.pipeline.filepass import FileResult, Session, UserSessions, pair_file
from idled.pipeline.paired import joins_in_seq_order, runs_of_files, small_table_rows
from idled.pipeline.records import FileStats, Row, iter_rows, seq_ranges_overlap, split_uid_key
from idled.pipeline.reference import compute, segment_files
from idled.pipeline.rules import FlapParams, unix_date
from idled.pipeline.userpass import PartitionResult, finish_detector, finish_user
from tests.pipeline.test_pipeline import KEYS, assert_tables_equal, dataset  # noqa: F401 (fixture)


def session_row(session: Session, names: Sequence[str]) -> dict[str, Any]:
    """A session as the sessions table holds it (`aggregate._sessions_out`)."""
    daemon, key, online_seq, online_ts, offline_seq, offline_ts, end_reason, device, end_device, _ = session
    uid, uid_type = split_uid_key(key)
    return {
        "date": unix_date(int(online_ts // 86400)), "daemon": names[daemon], "uid": uid, "uid_type": uid_type,
        "online_seq": online_seq, "online_ts": online_ts, "offline_seq": offline_seq, "offline_ts": offline_ts,
        "duration_s": None if offline_ts is None else offline_ts - online_ts, "end_reason": end_reason,
        "open": offline_seq is None, "device": device, "end_device": end_device,
    }


Run = tuple[int, Sequence[Sequence[Row]]]  # a daemon's consecutive files paired in one task: (daemon, rows per file)


def run_passes(runs: Sequence[Run], names: Sequence[str], params: FlapParams,
               grace: float = 0.0) -> tuple[dict[str, Any], dict[str, int]]:
    """Both passes over runs of files: the six tables and the counts."""
    user_sessions = UserSessions(grace, params.short_s) if grace > 0 else None
    result = PartitionResult()
    sessions: list[Session] = []
    carries: dict[str, list[tuple[int, Any]]] = {}
    lateness: dict[str, list[Any]] = {}
    data_end: dict[int, float] = {}
    for daemon, files in runs:
        file_result = FileResult()
        for rows in files:
            pair_file(iter(rows), params.short_s, file_result, user_sessions)
        sessions.extend(file_result.sessions)
        result.tally.merge(file_result.tally)
        if file_result.data_end is not None:
            data_end[daemon] = max(file_result.data_end, data_end.get(daemon, file_result.data_end))
        for key, carry in file_result.carries.items():
            carries.setdefault(key, []).append((daemon, carry))
        for detector, hours in file_result.lateness.items():
            lateness.setdefault(detector, []).append(hours)
    for key, chain in carries.items():
        finish_user(key, chain, data_end, params, result, sessions, user_sessions)
    for detector, pieces in lateness.items():
        finish_detector(detector, pieces, result)
    # As `arrowwrite.write_sessions` counts the sessions it writes.
    result.tally.count_written(np.array([s[3] for s in sessions], dtype=np.float64),
                               np.array([math.nan if s[5] is None else s[5] for s in sessions], dtype=np.float64),
                               user_sessions is None)
    tables: dict[str, Any] = small_table_rows(result)
    tables["sessions"] = [session_row(s, names) for s in sessions]
    tally = result.tally
    counts = {"sessions": tally.sessions, "open_sessions": tally.open_sessions, "orphans": tally.orphans,
              "superseded": tally.superseded}
    return tables, counts


def assert_passes_equal_reference(runs: Sequence[Run], names: Sequence[str], params: FlapParams, grace: float = 0.0) -> None:
    tables, counts = run_passes(runs, names, params, grace)
    expected = compute([row for _, files in runs for rows in files for row in rows], names, params, grace)
    for table in KEYS:
        assert_tables_equal(tables[table], expected.tables[table], table)
    for name, value in counts.items():
        assert value == expected.counts[name], name


def test_passes_equal_reference_on_generated_and_crafted_daemons(dataset: dict[str, Any]) -> None:  # noqa: F811
    dirs = [*dataset["dirs"][:2], dataset["clean_crafted"]]
    files: list[Run] = []
    ranges: dict[int, list[tuple[int | None, int | None, int]]] = {}
    for daemon, directory in enumerate(dirs):
        for path in segment_files(directory):
            stats = FileStats()
            files.append((daemon, [list(iter_rows(Path(path).read_bytes(), daemon, stats))]))
            ranges.setdefault(daemon, []).append((stats.min_seq, stats.max_seq, stats.unordered))
    assert not any(seq_ranges_overlap(r) for r in ranges.values())  # the premise of in-file pairing
    assert len(files) > 20  # many file edges (the crafted daemon's segments are tiny)
    for grace in (0.0, 30.0):
        assert_passes_equal_reference(files, dirs, FlapParams(k=3, short_s=60.0, window_s=3600), grace)


# A random record stream: per record (daemon, uid, online?, ts step, reason, idle with deadline?, device).
_RECORD = st.tuples(
    st.integers(0, 1), st.sampled_from(["i:1", "i:2", "s:1", "s:x"]), st.booleans(),
    st.floats(-30.0, 400.0) | st.floats(0.0, 5.0), st.sampled_from(["closed", "idle", "restart", "logout"]), st.booleans(),
    st.sampled_from([None, None, "phone", "laptop"]),
)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(_RECORD, max_size=60), cuts=st.lists(st.integers(1, 59), max_size=8),
       joins=st.lists(st.booleans(), min_size=9, max_size=9), grace=st.sampled_from([0.0, 0.0, 40.0, 2000.0]))
def test_passes_equal_reference_on_random_streams(records: list[tuple[Any, ...]], cuts: list[int], joins: list[bool],
                                                  grace: float) -> None:
    """Any interleaving of onlines and offlines (superseded, orphans, clock steps back, midnight, devices, the
    daemon's grace offlines), each daemon's stream cut into files at random seqs, and consecutive files joined
    into runs at random, with and without a --grace: the passes give the reference's tables."""
    check_random_stream(records, cuts, joins, grace)


# Streams for the grace: longer, two uids, mostly onlines and closed offlines, short steps -- sessions joined
# within and across files, by the daemon's grace or not (hypothesis' lists are short otherwise: ~no joins).
_GRACE_RECORD = st.tuples(
    st.integers(0, 1), st.sampled_from(["i:1", "s:x"]), st.booleans(), st.floats(-5.0, 60.0),
    st.sampled_from(["closed", "closed", "closed", "idle", "restart"]), st.booleans(),
    st.sampled_from([None, "phone"]),
)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_GRACE_RECORD, min_size=20, max_size=60), cuts=st.lists(st.integers(1, 59), max_size=8),
       joins=st.lists(st.booleans(), min_size=9, max_size=9), grace=st.sampled_from([20.0, 90.0]))
def test_passes_join_user_sessions_over_a_grace_as_the_reference(records: list[tuple[Any, ...]], cuts: list[int],
                                                                 joins: list[bool], grace: float) -> None:
    check_random_stream(records, cuts, joins, grace)


def check_random_stream(records: list[tuple[Any, ...]], cuts: list[int], joins: list[bool], grace: float) -> None:
    seqs = [0, 0]
    ts = 1777593600.0 + 86400 - 600  # ten minutes before a midnight
    per_daemon: list[list[Row]] = [[], []]
    for daemon, key, online, step, reason, with_deadline, device in records:
        seqs[daemon] += 1
        ts += step
        idle = not online and reason == "idle" and with_deadline
        daemon_grace = 5.0 if not online and reason == "closed" and with_deadline else None
        per_daemon[daemon].append((daemon, seqs[daemon], online, key, ts, reason, ts - 0.25 if idle else None,
                                   "heap" if idle else None, device, daemon_grace))
    runs: list[tuple[int, list[list[Row]]]] = []
    for daemon, rows in enumerate(per_daemon):
        edges = sorted({c for c in cuts if c < len(rows)})
        for i, (lo, hi) in enumerate(zip([0, *edges], [*edges, len(rows)])):
            if i and joins[i]:
                runs[-1][1].append(rows[lo:hi])  # the next file of the same run
            else:
                runs.append((daemon, [rows[lo:hi]]))
    runs.reverse()  # the order of runs never matters
    assert_passes_equal_reference(runs, ["d0", "d1"], FlapParams(k=2, short_s=60.0, window_s=600), grace)


def test_runs_cut_each_daemons_files_in_name_order_largest_run_first(tmp_path: Path) -> None:
    sizes = {"d0": [10, 10, 10, 10, 2], "d1": [30]}
    for daemon, files in sizes.items():
        (tmp_path / daemon).mkdir()
        for i, size in enumerate(files):
            (tmp_path / daemon / f"{i:05d}.seg").write_bytes(b"x" * size)
        (tmp_path / daemon / ".hidden.seg").write_bytes(b"x")
        (tmp_path / daemon / "00000.seg.quarantine-1").write_bytes(b"x")
    dirs = [str(tmp_path / "d0"), str(tmp_path / "d1")]
    runs = runs_of_files(dirs, 3)  # 72 bytes: about 24 a run; 30, 22 and 20 bytes, in that order
    assert runs == [(1, [f"{dirs[1]}/00000.seg"]), (0, [f"{dirs[0]}/{i:05d}.seg" for i in (2, 3, 4)]),
                    (0, [f"{dirs[0]}/00000.seg", f"{dirs[0]}/00001.seg"])]
    assert runs_of_files([*dirs, "hdfs:///logs/d2"], 3) is None  # read through Spark instead


def test_a_join_must_be_of_a_file_and_its_successor_in_seq_order() -> None:
    def stats(daemon: int, low: int | None, high: int | None) -> tuple[Any, ...]:
        return (daemon, 100, 10, 0, 0, 0, False, low, high, 0)

    per_file = {"a": stats(0, 1, 10), "c": stats(0, 21, 30), "b": stats(0, 11, 20), "empty": stats(0, None, None),
                "x": stats(1, 1, 5)}
    assert joins_in_seq_order(per_file, [("a", "b"), ("b", "c")])
    assert joins_in_seq_order(per_file, [])
    # Joined in name order a -> c, but b's records lie between: its pairing would skip them.
    assert not joins_in_seq_order(per_file, [("a", "c")])
    assert not joins_in_seq_order(per_file, [("a", "x")])  # another daemon's file
