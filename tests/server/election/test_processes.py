"""Campaigners in processes of their own (``campaigner.py``) against a real etcd: takeover after a resignation
and after SIGKILL, fencing of a SIGSTOPped leader, and no split brain throughout.

Theory of operation
-------------------
Each campaigner samples its own ``is_leader(time.monotonic())`` every 10 ms and prints when the answer
changes (``up``; ``down`` with the last true sample). All run on this machine, so CLOCK_MONOTONIC is one
clock for them all and their leadership runs -- from the first true sample to the last -- compare directly:
`assert_no_split_brain` checks that no two campaigners' runs overlap. A run still open when a campaigner is
SIGKILLed ends at the kill, the latest it could have claimed anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idled.tools.etcd import EtcdServer

pytestmark = pytest.mark.slow

CAMPAIGNER = Path(__file__).with_name("campaigner.py")
TTL = 2
TAKEOVER = TTL + 1.0  # the brief: another leader within the lease time + 1 s
Event = dict[str, Any]


class Campaigner:
    """One campaigner process and the events it printed (read by a thread)."""

    def __init__(self, url: str, address: str, log_dir: Path) -> None:
        self.address = address
        self.events: list[Event] = []
        self.ended: float | None = None  # when we SIGKILLed it
        self._changed = threading.Condition()
        self._stderr = open(log_dir / f"{address.replace(':', '_')}.stderr", "wb")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, str(CAMPAIGNER), url, address, str(TTL)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    def wait_for(self, event: str, timeout: float, since: int = 0, **fields: Any) -> Event:
        """The first event named ``event`` (with these field values) at index ``since`` or later."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for found in self.events[since:]:
                    if found["event"] == event and all(found.get(k) == v for k, v in fields.items()):
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._changed.wait(0.2)):
                    raise AssertionError(f"{self.address}: no {event} {fields} in {timeout} s: {self.events}")
                self._changed.wait(left)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()

    def leading(self) -> bool:
        """Its last word: up (and not down since)."""
        with self._changed:
            changes = [e["event"] for e in self.events if e["event"] in ("up", "down")]
        return bool(changes) and changes[-1] == "up"

    def runs(self) -> list[tuple[float, float]]:
        """Its leadership runs, first true sample to last (an open run ends when it was killed, or now)."""
        runs, start = [], None
        with self._changed:
            events = list(self.events)
        for event in events:
            if event["event"] == "up":
                start = event["t"]
            elif event["event"] == "down" and start is not None:
                runs.append((start, event["last_true"]))
                start = None
        if start is not None:
            runs.append((start, self.ended if self.ended is not None else time.monotonic()))
        return runs

    def kill(self) -> None:
        self.ended = time.monotonic()
        self.process.kill()
        self.process.wait(timeout=10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._stderr.close()


@pytest.fixture
def campaigners(etcd: EtcdServer, prefix: str, tmp_path: Path) -> Iterator[Callable[[str], Campaigner]]:
    started: list[Campaigner] = []

    def start(address: str) -> Campaigner:
        campaigner = Campaigner(etcd.url(prefix), address, tmp_path)
        started.append(campaigner)
        campaigner.wait_for("started", 15)
        return campaigner

    try:
        yield start
    finally:
        for campaigner in started:
            campaigner.close()


def assert_no_split_brain(*campaigners: Campaigner) -> None:
    for i, one in enumerate(campaigners):
        for other in campaigners[i + 1:]:
            for a_start, a_end in one.runs():
                for b_start, b_end in other.runs():
                    assert a_end < b_start or b_end < a_start, (
                        f"split brain: {one.address} led {a_start:.3f}-{a_end:.3f}, "
                        f"{other.address} led {b_start:.3f}-{b_end:.3f}")


def first_leader(a: Campaigner, b: Campaigner) -> tuple[Campaigner, Campaigner]:
    deadline = time.monotonic() + TAKEOVER + 5
    while time.monotonic() < deadline:
        if a.leading() or b.leading():
            time.sleep(3 * TTL / 3)  # a few renewals: the other must stay a follower
            assert a.leading() != b.leading(), (a.events, b.events)
            return (a, b) if a.leading() else (b, a)
        time.sleep(0.02)
    raise AssertionError(f"nobody elected: {a.events} {b.events}")


def test_takeover_after_resignation_and_after_sigkill(campaigners: Callable[[str], Campaigner]) -> None:
    a, b = campaigners("127.0.0.2:7878"), campaigners("127.0.0.3:7878")
    leader, follower = first_leader(a, b)
    follower.wait_for("status", 5, address=leader.address)  # the follower knows where to redirect

    resigned = time.monotonic()
    leader.send("resign")
    up = follower.wait_for("up", TAKEOVER)
    assert up["t"] - resigned < 1.0  # the key went with the revoked lease: no waiting for the ttl
    leader.wait_for("resigned", 5)

    third = campaigners("127.0.0.4:7878")
    third.wait_for("status", 5, address=follower.address)
    assert not third.leading()
    follower.kill()
    up = third.wait_for("up", TAKEOVER + 1)
    assert up["t"] - follower.ended < TAKEOVER, (follower.ended, up)  # type: ignore[operator]
    assert_no_split_brain(a, b, third)


def test_a_sigstopped_leader_is_fenced_on_waking(campaigners: Callable[[str], Campaigner]) -> None:
    a, b = campaigners("127.0.0.2:7878"), campaigners("127.0.0.3:7878")
    leader, follower = first_leader(a, b)
    leader.send("publish 5")
    leader.wait_for("published", 5, seq=5)

    since = len(leader.events)
    os.kill(leader.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        up = follower.wait_for("up", TAKEOVER)
        assert up["t"] - stopped < TAKEOVER
        time.sleep(max(0.0, stopped + TTL + 0.5 - time.monotonic()))  # stopped for longer than the lease
    finally:
        woken = time.monotonic()
        os.kill(leader.process.pid, signal.SIGCONT)
    leader.send("publish 6")
    refused = leader.wait_for("refused", 5, since=since, seq=6)
    assert refused["code"] == "not_leader"
    down = leader.wait_for("down", 5, since=since)
    assert down["last_true"] < stopped  # no true sample after the stop...
    assert woken <= down["t"] < woken + 1.0  # ...and false from its first look on waking (a loaded machine's slack)
    assert not [e for e in leader.events[since:] if e["event"] in ("published", "up")]

    follower.send("last")
    assert follower.wait_for("last", 5)["seq"] == 5  # where the new leader continues
    follower.send("publish 6")
    follower.wait_for("published", 5, seq=6)
    time.sleep(TTL / 3)  # the woken one campaigns again, and follows
    assert not leader.leading()
    assert_no_split_brain(a, b)
