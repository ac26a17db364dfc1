"""The state directory: one hook at a time, an atomic checkpoint, durable dead letters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idled.hook.batch import Batch
from idled.hook.state import StateDir, StateError


def test_checkpoint_round_trip_and_lock(tmp_path: Path) -> None:
    state = StateDir(str(tmp_path / "s"))
    try:
        assert state.read_checkpoint() is None
        state.commit_checkpoint(42, 1.5)
        assert state.read_checkpoint() == 42
        assert not (tmp_path / "s" / "checkpoint.tmp").exists()
        with pytest.raises(StateError) as info:
            StateDir(str(tmp_path / "s"))
        assert info.value.code == "locked" and "another idled hook" in info.value.reason
    finally:
        state.close()
    StateDir(str(tmp_path / "s")).close()  # released


def test_a_damaged_checkpoint_is_an_error_not_a_restart(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_text("{\"seq\": -1}")
    state = StateDir(str(tmp_path))
    try:
        with pytest.raises(StateError) as info:
            state.read_checkpoint()
        assert info.value.code == "damaged"
    finally:
        state.close()


def test_dead_letters_are_json_lines_with_the_posted_body(tmp_path: Path) -> None:
    state = StateDir(str(tmp_path))
    batch = Batch(((5, 1.0, b'{"seq":5}'), (6, 2.0, b'{"seq":6}')), 7)
    state.append_dead_letter(batch, 10, "HTTP 500", 3.0)
    state.append_dead_letter(batch, 10, "timeout", 4.0)
    state.close()
    lines = [json.loads(line) for line in (tmp_path / "dead-letter.jsonl").read_text().splitlines()]
    assert [line["error"] for line in lines] == ["HTTP 500", "timeout"]
    assert lines[0]["batch"] == {"first_seq": 5, "last_seq": 6, "events": [{"seq": 5}, {"seq": 6}]}
    assert lines[0]["delivery"] == "5-6" and lines[0]["attempts"] == 10


def test_dead_letters_waiting_are_counted_for_the_start_line(tmp_path: Path) -> None:
    state = StateDir(str(tmp_path))
    try:
        assert state.dead_letter_bytes() == 0
        state.append_dead_letter(Batch(((5, 1.0, b'{"seq":5}'),), 5), 3, "HTTP 500", 3.0)
        (tmp_path / "dead-letter.redrive.jsonl").write_bytes(b"x" * 10)  # an unfinished redrive's
        assert state.dead_letter_bytes() == (tmp_path / "dead-letter.jsonl").stat().st_size + 10
    finally:
        state.close()
