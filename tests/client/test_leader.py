"""Finding the leader among several cores: the order of attempts (pure, no I/O; the address lists are the
one grammar's, tests/protocol/test_address.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from idled.client.errors import NotLeader, error_from
from idled.client.leader import LeaderSearch


def test_one_core_is_today_s_loop_every_failure_ends_a_round() -> None:
    search = LeaderSearch(["A"])
    assert search.failed() is False and search.target == "A"
    assert search.failed() is False and search.target == "A"
    search.connected()
    search.lost()
    assert search.target == "A"


def test_the_members_in_turn_then_a_backoff() -> None:
    search = LeaderSearch(["A", "B", "C"])
    assert search.target == "A"
    assert search.failed() and search.target == "B"
    assert search.failed() and search.target == "C"
    assert not search.failed() and search.target == "A"  # round over: back off, start again
    assert search.failed() and search.target == "B"


def test_a_hint_is_followed_first_and_the_worked_example() -> None:
    search = LeaderSearch(["S", "A"])
    assert search.failed("A") and search.target == "A"
    search.connected()
    assert search.leader == "A"
    search.lost()
    assert search.target == "A"  # the last leader first
    assert search.failed() and search.target == "S"
    assert not search.failed("A") and search.target == "A"  # A tried in this round: round over, starting at A
    assert search.failed() and search.target == "S"
    search.connected()
    assert search.leader == "S"


def test_stale_cores_naming_each_other_do_not_ping_pong() -> None:
    search = LeaderSearch(["A", "B"])
    assert search.failed("B") and search.target == "B"
    assert not search.failed("A")  # A was tried: the round is over
    assert search.target == "A"


def test_a_hint_outside_the_list_is_followed_a_bounded_number_of_times() -> None:
    search = LeaderSearch(["A", "B"])
    assert search.failed("X") and search.target == "X"
    assert search.failed("Y") and search.target == "Y"
    assert search.failed("Z") and search.target == "B"  # two extra hops per round at most, then the list
    assert not search.failed("W") and search.target == "W"  # the next round starts at the last hint


def test_a_connection_lost_with_a_hint_starts_there() -> None:
    search = LeaderSearch(["A", "B"])
    search.connected()
    search.lost("B")
    assert search.target == "B"


@given(st.lists(st.sampled_from("ABCDXY"), min_size=1, max_size=4, unique=True),
       st.lists(st.one_of(st.none(), st.sampled_from("ABCDXYZ")), max_size=60))
def test_every_round_ends_and_tries_every_member(members: list[str], hints: list[str | None]) -> None:
    search = LeaderSearch(members)
    tried: set[str] = {search.target}
    attempts = 1
    for hint in hints:
        more = search.failed(hint)
        if not more:
            assert set(members) <= tried  # a round ends only when every member was tried
            assert attempts <= 2 * len(members) + 1  # and bounded: a start at a hint, the list, its hints
            tried, attempts = set(), 0
        tried.add(search.target)
        attempts += 1


def test_not_leader_is_retryable_and_keeps_the_hint() -> None:
    error = error_from("not_leader", "standby of 127.0.0.2:7878", "127.0.0.2:7878")
    assert isinstance(error, NotLeader) and error.retryable and error.leader == "127.0.0.2:7878"
    assert error_from("not_leader", "no leader now").leader is None  # type: ignore[attr-defined]
