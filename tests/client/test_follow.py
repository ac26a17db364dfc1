"""The follow policy (`idled.client.follow.Follow`) by hand: what is followed, for how long, what is said."""

from __future__ import annotations

import pytest
import trio

from idled.client.errors import ConnectionLost, error_from
from idled.client.follow import Follow
from idled.client.observer import Observer
from idled.client.trio import TRIO, open_gateway, running
from tests.client.support import HOST, Idled

A, B = "10.0.0.1:7878", "10.0.0.2:7878"


def _follow(give_up_after: float | None = 60.0, from_start: bool = False) -> tuple[Follow, list[str]]:
    said: list[str] = []
    return Follow(said.append, give_up_after=give_up_after, from_start=from_start), said


def test_the_first_login_is_one_round_unless_from_start() -> None:
    follow, _ = _follow()
    assert not follow.keep_trying(ConnectionLost("refused"), 0, 0.0, f"{A}, {B}")
    service, _ = _follow(from_start=True, give_up_after=None)
    assert service.keep_trying(ConnectionLost("refused"), 0, 0.0, A)


def test_a_loss_is_followed_until_the_timeout_then_the_reason_names_the_cores() -> None:
    follow, _ = _follow(give_up_after=5.0)
    lost = ConnectionLost("the server closed the connection")
    assert follow.keep_trying(lost, 1, 100.0, f"{A}, {B}")
    refused = error_from("not_leader", "standby", A)
    assert follow.keep_trying(refused, 1, 104.9, f"{A}, {B}")
    assert not follow.keep_trying(refused, 1, 105.0, f"{A}, {B}")
    assert follow.gave_up == (f"no core took the login within 5 s (of {A}, {B}; last: not_leader: standby)")


def test_a_login_starts_the_clock_again() -> None:
    follow, said = _follow(give_up_after=5.0)
    lost = ConnectionLost("closed")
    assert follow.keep_trying(lost, 1, 100.0, A)
    follow.logged_in(B, 2)
    assert said == [f"now on {B}"]
    assert follow.keep_trying(lost, 2, 200.0, A)
    assert follow.keep_trying(lost, 2, 204.0, A)


@pytest.mark.parametrize("code", ["idle_timeout", "auth_failed", "kicked", "bad_message"])
def test_what_is_not_a_failover_is_final(code: str) -> None:
    follow, _ = _follow()
    assert not follow.keep_trying(error_from(code, "x"), 1, 0.0, A)
    assert follow.gave_up is None


def test_a_round_is_said_once_with_what_each_core_said() -> None:
    follow, said = _follow()
    follow.retrying(A, (A, B), ConnectionLost("closed"), True, 0.05)
    follow.retrying(A, (A, B), ConnectionLost("refused"), False, 0.0)
    follow.retrying(B, (A, B), error_from("not_leader", "standby"), False, 0.4)
    assert said == [
        f"lost the core at {A} (connection_lost: closed): looking for the leader among {A}, {B}",
        f"no core took the login ({A}: connection_lost: refused; {B}: not_leader: standby); next round in 0.4 s",
    ]


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        _follow(give_up_after=0.0)


@pytest.mark.slow
async def test_an_observer_is_set_up_at_its_replays_first_event_even_with_a_full_mailbox(idled: Idled) -> None:
    """A connection counts as up once its subscription is taken (Link._settle): the first frame after it
    that is not an error. A replay longer than the observer's mailbox must settle it before the application
    reads anything (the ping's pong comes only after the replay, behind a reader the full mailbox holds up)."""
    async with open_gateway(HOST, idled.port, "replayer", flush_interval=0.01) as gateway:
        await gateway.attach([f"u{i}" for i in range(50)], keepalive=60)
        await gateway.flush()
        observer = Observer(TRIO, HOST, idled.port, "settles", after=0, buffer=4, reconnect=False)
        async with running(observer):
            with trio.fail_after(5):
                while observer.settled == 0:
                    await trio.sleep(0.01)
            seqs = [(await observer.__anext__()).seq for _ in range(50)]
        assert seqs == list(range(1, 51))
