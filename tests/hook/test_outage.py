"""A receiver down for an hour, then back: nothing dead-lettered, every event delivered, first deliveries in
seq order -- with the default retry schedule, and without waiting an hour.

Real parts: an `idled serve` subprocess, a gateway making events, `idled hook` as a subprocess, a real receiver
on 127.0.0.1 whose port is closed (connections refused, kept-alive ones cut) for the outage and opened again.
The hook runs with trio's clock ``RATE`` times as fast as the wall (`tests.hook.fastclock`: trio's own
``clock=`` argument, ``MockClock(rate=RATE)``): everything that decides when to retry and when to give up --
the backoff sleeps and the ``--retry-for`` budget -- lives on that clock, so the hook lives through the whole
hour, attempt by attempt, against the real refusing port, in 3600/RATE real seconds. Its wall clock is the
real one, so every attempt still verifies with the stock `standardwebhooks` library (5 minutes' tolerance).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
import trio
from standardwebhooks import Webhook

from tests import peers
from tests.hook.helpers import WHSEC, Hook, gateway_events, hook_command, log_records, until
from tests.hook.receiver import Receiver

pytestmark = pytest.mark.slow

RATE = 240.0  # an hour of the hook's clock in 15 s
OUTAGE = 3600.0


def fast(command: list[str]) -> list[str]:
    """``python -m idled.cli.main ...`` as ``python -m tests.hook.fastclock RATE ...``."""
    at = command.index("idled.cli.main")
    return [*command[:at], "tests.hook.fastclock", str(RATE), *command[at + 1:]]


async def test_a_receiver_down_for_an_hour_then_back_dead_letters_nothing(tmp_path: Path) -> None:
    data_dir, state, secret_file = tmp_path / "data", tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    port, receiver_port = peers.free_port(), peers.stable_port()  # the receiver's is closed and reopened
    command = peers.serve_command(data_dir, "--fsync", "always", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    # Only the per-request and connect timeouts are widened (2 minutes of the hook's clock, 0.5 s real: a
    # loopback answer under a loaded CI machine must not count as a timeout); the retry schedule is the default.
    url = f"http://127.0.0.1:{receiver_port}/hook"
    hook_argv = fast(hook_command(url, port, state, secret_file, "--from", "1", "--timeout", "120",
                                  "--connect-timeout", "120"))
    async with peers.Daemon(command, tmp_path / "daemon.stderr"):
        with Receiver(port=receiver_port) as before:
            hook = Hook(hook_argv, tmp_path / "hook.stderr")
            try:
                await gateway_events(port, [f"a{i}" for i in range(10)], "gw1")  # 10 onlines, 10 offlines
                await until(lambda: len(before.acked_events()) >= 20, 20, "delivery before the outage")
            except BaseException:
                hook.kill()
                raise
        down = time.monotonic()
        try:
            await gateway_events(port, [f"b{i}" for i in range(10)], "gw2")  # queued behind the outage
            await until(lambda: re.search(r"failed, attempt 3\b", hook.stderr()), 20, "the hook retrying")
            await trio.sleep(OUTAGE / RATE - (time.monotonic() - down))
            with Receiver(port=receiver_port) as after:
                back = time.monotonic()
                expected = [record["seq"] for record in log_records(data_dir)]
                await until(lambda: [e["seq"] for e in after.acked_events()][-1:] == expected[-1:], 20,
                            "every event delivered after the outage")
                caught_up = time.monotonic() - back
                await gateway_events(port, ["c0"], "gw3")
                await until(lambda: after.acked_events()[-1]["uid"] == "c0", 20, "delivery goes on")
                hook.proc.send_signal(signal.SIGTERM)
                assert await hook.wait() == 0, hook.stderr()
        finally:
            hook.kill()
    stderr = hook.stderr()
    assert not (state / "dead-letter.jsonl").exists() and "DEAD-LETTERED" not in stderr
    seqs = [event["seq"] for receiver in (before, after) for event in receiver.acked_events()]
    first = list(dict.fromkeys(seqs))
    assert first == [record["seq"] for record in log_records(data_dir)], "every event, first deliveries in order"
    failures = [(int(n), float(elapsed), float(delay)) for n, elapsed, delay in
                re.findall(r"failed, attempt (\d+), (\d+) s since the first: .*; retrying in ([\d.]+) s", stderr)]
    attempts, lasted, _ = failures[-1]
    assert lasted >= 0.9 * OUTAGE, f"the hook's clock saw {lasted} s of failures"  # it lived through the hour
    assert max(delay for _, _, delay in failures) <= 60.0  # the default cap: never a minute between attempts
    assert 60 <= attempts <= 400, attempts  # ~one a 30 s on average: no hammering, no giving up
    assert caught_up * RATE <= 60.0 + 120.0, caught_up  # back within the cap (+ the request's own deadline)
    webhook = Webhook(WHSEC)
    for request in before.attempts + after.attempts:
        webhook.verify(request.body, request.headers)
