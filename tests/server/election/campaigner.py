"""A campaigner in a process of its own, for the election tests (``python campaigner.py URL ADDRESS TTL``).

It runs an `EtcdElection` on ``time.monotonic`` (CLOCK_MONOTONIC: shared by every process of the machine, so
two campaigners' timestamps compare) and prints JSON lines on stdout:

* ``{"event": "up", "t": T}``: the first sample (every 10 ms) at which ``is_leader(T)`` was true;
* ``{"event": "down", "t": T, "last_true": T0}``: the first sample at which it was false again, and the last
  one at which it was true -- so a test sees both a leadership's claims and how promptly it ended;
* ``{"event": "status", ...}``: each `Status` the election published;
* answers to commands read from stdin: ``publish N`` -> ``published``/``refused`` (with the error code),
  ``last`` -> ``last``, ``resign`` -> ``resigned`` (then it exits).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, when run as a script

from idled.server.election import NotLeader, Timings, parse_election_url  # noqa: E402
from idled.server.election.etcd import EtcdElection  # noqa: E402

SAMPLE = 0.010


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class Sampler:
    """``is_leader`` every 10 ms; prints the changes."""

    def __init__(self, election: EtcdElection) -> None:
        self.election = election
        self.leading = False
        self.last_true = 0.0

    def once(self) -> None:
        now = time.monotonic()
        leading = self.election.is_leader(now)
        if leading and not self.leading:
            emit("up", t=now, deadline=self.election.deadline)
        elif self.leading and not leading:
            emit("down", t=now, last_true=self.last_true)
        if leading:
            self.last_true = now
        self.leading = leading

    async def run(self) -> None:
        while True:
            self.once()
            await trio.sleep(SAMPLE)


async def report(election: EtcdElection) -> None:
    seen = 0
    while True:
        status = await election.status.next(seen)
        seen = status.version
        emit("status", leader=status.leader, address=status.address, term=status.term, reason=status.reason,
             t=time.monotonic())


async def commands(election: EtcdElection, sampler: Sampler, nursery: trio.Nursery) -> None:
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    buffer = b""
    while True:
        data = await stream.receive_some(4096)
        if not data:
            nursery.cancel_scope.cancel()
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, _, arg = line.decode().strip().partition(" ")
            if word == "publish":
                try:
                    await election.publish_seq(int(arg))
                    emit("published", seq=int(arg), t=time.monotonic())
                except NotLeader as exc:
                    emit("refused", seq=int(arg), code=exc.code, t=time.monotonic())
            elif word == "last":
                emit("last", seq=await election.last_seq())
            elif word == "resign":
                await election.resign()
                sampler.once()  # its last word before it exits
                emit("resigned", t=time.monotonic())
                nursery.cancel_scope.cancel()
                return


async def main(url: str, address: str, ttl: int) -> None:
    async with EtcdElection(parse_election_url(url), address, timings=Timings.of(ttl)) as election:
        async with trio.open_nursery() as nursery:
            sampler = Sampler(election)
            nursery.start_soon(sampler.run)
            nursery.start_soon(report, election)
            await nursery.start(election.run)
            emit("started", t=time.monotonic())
            nursery.start_soon(commands, election, sampler, nursery)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
