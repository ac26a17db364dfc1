"""`idled hook` end to end, with real parts: an `idled serve` subprocess, users made through a gateway, a real
HTTP receiver on 127.0.0.1 that resets, stalls, answers 500 and 429 + Retry-After before it accepts, and the
hook as a subprocess -- SIGKILLed mid-run and restarted, the daemon restarted under it.

What must hold: every event of the daemon's log reaches the receiver at least once, with every field the log
has; first deliveries come in strictly increasing seq order with no gap; every signature verifies; the
checkpoint on disk is never ahead of what the receiver acknowledged; SIGTERM exits 0.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from standardwebhooks import Webhook
from tests import peers
from tests.hook.helpers import SECRET, WHSEC, Hook, checkpoint, gateway_events, hook_command, log_records, until
from tests.hook.receiver import Receiver

pytestmark = pytest.mark.slow

FAST_RETRIES = ("--timeout", "1", "--backoff-base", "0.05", "--backoff-cap", "0.2", "--batch-max", "40")


def daemon(data_dir: Path, port: int, stderr: Path) -> peers.Daemon:
    command = peers.serve_command(data_dir, "--fsync", "always", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    return peers.Daemon(command, stderr)


def first_deliveries(receiver: Receiver) -> list[int]:
    seen: set[int] = set()
    order = []
    for event in receiver.acked_events():
        if event["seq"] not in seen:
            seen.add(event["seq"])
            order.append(event["seq"])
    return order


def check_signatures(receiver: Receiver) -> None:
    webhook = Webhook(WHSEC)
    for request in receiver.attempts:
        body = webhook.verify(request.body, request.headers)
        assert request.headers["webhook-id"] == f"{body['first_seq']}-{body['last_seq']}"


async def sample_checkpoints(state: Path, receiver: Receiver, problems: list[str]) -> None:
    while True:
        committed = checkpoint(state)  # read first: a commit follows its acknowledgement
        acked = max((e["seq"] for e in receiver.acked_events()), default=0)
        if committed is not None and committed > acked and acked:
            problems.append(f"checkpoint {committed} ahead of the acknowledged {acked}")
        await trio.sleep(0.01)


def same_fields(delivered: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(delivered.get(key) == value for key, value in record.items())


async def test_every_event_arrives_in_order_across_kills_restarts_and_receiver_failures(tmp_path: Path) -> None:
    data_dir, state, secret_file = tmp_path / "data", tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET + b"\n")
    port = peers.free_port()
    problems: list[str] = []
    with Receiver(["reset", "stall:1.5", "500", "429:1"]) as receiver:
        command = hook_command(receiver.url, port, state, secret_file, "--from", "1", *FAST_RETRIES)
        first = daemon(data_dir, port, tmp_path / "daemon-0.stderr")
        async with first, trio.open_nursery() as nursery:
            nursery.start_soon(sample_checkpoints, state, receiver, problems)
            await gateway_events(port, [f"a{i}" for i in range(60)])
            hook = Hook(command, tmp_path / "hook.stderr")
            await hook.subscribed()
            await until(lambda: len(receiver.acked) >= 1, 20, "the first batch after the receiver's failures")
            hook.kill()  # SIGKILL mid-run
            await gateway_events(port, [f"b{i}" for i in range(60)], "gw2")
            hook = Hook(command, tmp_path / "hook.stderr")
            await hook.subscribed(2)
            assert "--from 1 ignored" in hook.stderr()
            await first.stop()
            second = daemon(data_dir, port, tmp_path / "daemon-1.stderr")
            async with second:
                await gateway_events(port, [f"c{i}" for i in range(60)], "gw3")
                expected = [record["seq"] for record in log_records(data_dir)]
                await until(lambda: set(expected) <= {e["seq"] for e in receiver.acked_events()}, 30,
                            "every logged event delivered")
                hook.proc.send_signal(signal.SIGTERM)
                assert await hook.wait() == 0, hook.stderr()
            nursery.cancel_scope.cancel()
    records = {record["seq"]: record for record in log_records(data_dir)}
    order = first_deliveries(receiver)
    assert order == list(range(1, len(order) + 1)), "first deliveries: increasing, no gap"
    assert set(records) <= set(order)
    by_seq = {event["seq"]: event for event in receiver.acked_events()}
    assert all(same_fields(by_seq[seq], record) for seq, record in records.items())
    assert [r.step for r in receiver.attempts[:5]] == ["reset", "stall:1.5", "500", "429:1", "ok"]
    assert receiver.attempts[4].received - receiver.attempts[3].received >= 0.9  # Retry-After: 1 honoured
    check_signatures(receiver)
    assert not problems, problems
    assert checkpoint(state) == max(order)
    assert "stopped" in hook.stderr()


async def test_a_batch_refused_max_attempts_times_is_dead_lettered_and_passed(tmp_path: Path) -> None:
    data_dir, state, secret_file = tmp_path / "data", tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET)
    port = peers.free_port()
    with Receiver(["500", "500", "500"]) as receiver:
        async with daemon(data_dir, port, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--max-attempts", "3",
                                     "--batch-wait", "0.5", *FAST_RETRIES), tmp_path / "hook.stderr")
            try:
                await hook.subscribed()
                await gateway_events(port, ["x1", "x2", "x3"])
                await until(lambda: (state / "dead-letter.jsonl").exists(), 20, "a dead letter")
                await gateway_events(port, ["y1"], "gw2")
                await until(lambda: receiver.acked, 20, "the next batch delivered")
            finally:
                hook.kill()
    import json

    (line,) = (state / "dead-letter.jsonl").read_text().splitlines()
    letter = json.loads(line)
    assert letter["attempts"] == 3 and "HTTP 500" in letter["error"]
    dead = [event["seq"] for event in letter["batch"]["events"]]
    assert [r.json()["events"] for r in receiver.attempts[:3]] == [letter["batch"]["events"]] * 3
    assert receiver.acked_events()[0]["seq"] > max(dead)
    assert "DEAD-LETTERED" in hook.stderr()
    assert (checkpoint(state) or 0) >= max(dead)


@pytest.mark.parametrize("options, wanted", [
    (("--filter", "kind=offline"), lambda r: r["kind"] == "offline"),
    (("--uid", "f1", "--uid", "f4"), lambda r: r["uid"] in ("f1", "f4")),
])
async def test_a_filtered_hook_posts_exactly_the_matching_events(tmp_path: Path, options: tuple[str, ...],
                                                               wanted: Any) -> None:
    data_dir, state, secret_file = tmp_path / "data", tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET)
    port = peers.free_port()
    with Receiver() as receiver:
        async with daemon(data_dir, port, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", *options),
                        tmp_path / "hook.stderr")
            try:
                await gateway_events(port, [f"f{i}" for i in range(8)])
                await until(lambda: checkpoint(state) == log_records(data_dir)[-1]["seq"], 20,
                            "the checkpoint past every event")
                time.sleep(0.1)
                records = log_records(data_dir)
            finally:
                hook.kill()
    expected = [r["seq"] for r in records if wanted(r)]
    assert expected and [e["seq"] for e in receiver.acked_events()] == expected


async def test_sigterm_abandons_a_stalled_request_within_the_grace_and_commits_nothing(tmp_path: Path) -> None:
    data_dir, state, secret_file = tmp_path / "data", tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET)
    port = peers.free_port()
    with Receiver(["stall:5"]) as receiver:
        async with daemon(data_dir, port, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", "--timeout", "30",
                                     "--stop-grace", "0.3"), tmp_path / "hook.stderr")
            try:
                await hook.subscribed()
                await gateway_events(port, ["s1", "s2"])
                await until(lambda: receiver.attempts, 20, "the request in flight")
                started = time.monotonic()
                hook.proc.send_signal(signal.SIGTERM)
                assert await hook.wait() == 0, hook.stderr()
                assert time.monotonic() - started < 3
            finally:
                hook.kill()
    assert checkpoint(state) == 0  # --from 1 pinned it; the stalled batch was never acknowledged


async def test_a_full_disk_under_the_state_directory_holds_the_checkpoint_back_not_the_delivery(
    tmp_path: Path,
) -> None:
    data_dir, secret_file = tmp_path / "data", tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET)
    port = peers.free_port()
    with peers.small_tmpfs(tmp_path, "256k") as disk, Receiver() as receiver:
        state = disk / "state"
        async with daemon(data_dir, port, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", "--batch-wait", "0.1"),
                        tmp_path / "hook.stderr")
            try:
                await hook.subscribed()
                await gateway_events(port, ["a1", "a2"])
                await until(lambda: checkpoint(state) == log_records(data_dir)[-1]["seq"], 20, "the first checkpoint")
                stat = os.statvfs(disk)
                (disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize))
                before = checkpoint(state)
                await gateway_events(port, ["b1", "b2"], "gw2")
                last = log_records(data_dir)[-1]["seq"]
                await until(lambda: any(e["seq"] == last for e in receiver.acked_events()), 20, "delivery goes on")
                assert hook.proc.poll() is None and checkpoint(state) == before  # held back, not lost, not torn
                assert hook.stderr().count("No space left on device") == 1  # one warning, not one per batch
                (disk / "filler").unlink()
                await gateway_events(port, ["c1"], "gw3")
                await until(lambda: checkpoint(state) == log_records(data_dir)[-1]["seq"], 20, "the checkpoint again")
                assert "written again" in hook.stderr()
            finally:
                hook.kill()
    assert sorted({e["seq"] for e in receiver.acked_events()}) == [r["seq"] for r in log_records(data_dir)]
