"""`idled watch --uid U` (repeatable) and `--int`: the watchlist the command asks for (the daemon side is in
tests/server/roles/test_watchlists_e2e.py)."""

from __future__ import annotations

import pytest

from idled.cli import main as cli
from idled.cli.watch import watch_uids


def parse(*argv: str) -> list[str | int] | None:
    return watch_uids(cli.build_parser("watch").parse_args(["watch", *argv]))


def test_uids_are_strings_unless_int() -> None:
    assert parse() is None  # every event
    assert parse("--uid", "alice", "--uid", "42") == ["alice", "42"]
    assert parse("--uid", "7", "--int", "--uid", "42") == [7, 42]


def test_bad_combinations_are_refused() -> None:
    with pytest.raises(ValueError, match="not an integer"):
        parse("--uid", "alice", "--int")
    with pytest.raises(ValueError, match="--int needs --uid"):
        parse("--int")
    assert cli.main(["watch", "--int", "--port", "1"]) == 2
