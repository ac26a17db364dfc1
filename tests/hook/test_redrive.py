"""`idled hook --redrive`: the dead letters posted again in order and cleared; a crash mid-redrive loses
nothing and repeats at most the line in flight; a line that fails again stays; a damaged file changes nothing.

Real parts: dead letters written by a real `idled hook` (against an `idled serve` and a refusing receiver) or
by the state directory's own writer, `idled hook --redrive` as a subprocess (SIGKILLed mid-request in one
test), and a receiver on 127.0.0.1 whose every request is verified with PyPI's `standardwebhooks`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from idled.hook.batch import Batch
from idled.hook.redrive import REDRIVE_FILE, REDRIVE_OFFSET
from idled.hook.state import StateDir
from tests import peers
from tests.hook.helpers import WHSEC, Hook, gateway_events, hook_command, log_records, until
from tests.hook.receiver import Receiver

pytestmark = pytest.mark.slow


def redrive_command(url: str, state: Path, secret_file: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "idled.cli.main", "hook", "--redrive", "--url", url, "--state", str(state),
            "--hook-secret-file", str(secret_file), "--log-level", "debug", *options]


def redrive(url: str, state: Path, secret_file: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(redrive_command(url, state, secret_file, *options), capture_output=True, text=True,
                          timeout=60)


def letters(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_letters(state: Path, count: int, first: int = 1) -> list[Batch]:
    batches = [Batch(((seq, 1.0, b'{"seq":%d,"ts":1.0,"uid":"u%d"}' % (seq, seq)),
                      (seq + 1, 2.0, b'{"seq":%d,"ts":2.0,"uid":"u%d"}' % (seq + 1, seq + 1))), seq + 1)
               for seq in range(first, first + 2 * count, 2)]
    holder = StateDir(str(state))
    try:
        for batch in batches:
            holder.append_dead_letter(batch, 3, "HTTP 500", 5.0)
    finally:
        holder.close()
    return batches


def verified_ids(receiver: Receiver, acked_only: bool = True) -> list[str]:
    webhook = Webhook(WHSEC)
    requests = receiver.acked if acked_only else receiver.attempts
    for request in requests:
        webhook.verify(request.body, request.headers)
    return [request.headers["webhook-id"] for request in requests]


async def test_dead_letters_of_a_real_hook_are_redriven_in_order_and_cleared(tmp_path: Path) -> None:
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--fsync", "always", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    with Receiver(["500"] * 1000) as refusing:
        async with peers.Daemon(command, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(refusing.url, port, state, secret_file, "--from", "1", "--max-attempts", "1",
                                     "--batch-max", "6"), tmp_path / "hook.stderr")
            try:
                await gateway_events(port, [f"d{i}" for i in range(12)])  # 24 events, 4+ batches
                await until(lambda: sum(len(letter["batch"]["events"])  # type: ignore[index, arg-type]
                                        for letter in letters(state / "dead-letter.jsonl")) == 24, 20,
                            "every batch dead-lettered")
                expected = [record["seq"] for record in log_records(tmp_path / "data")]
                hook.proc.send_signal(signal.SIGTERM)
                assert await hook.wait() == 0
            finally:
                hook.kill()
    dead = letters(state / "dead-letter.jsonl")
    with Receiver() as receiver:
        result = redrive(receiver.url, state, secret_file)
    assert result.returncode == 0, result.stderr
    assert f"redrive: {len(dead)} dead letters sent again" in result.stderr
    assert verified_ids(receiver, acked_only=False) == [letter["delivery"] for letter in dead]
    assert [e["seq"] for e in receiver.acked_events()] == expected == list(range(1, 25))
    assert [request.json() for request in receiver.acked] == [letter["batch"] for letter in dead]
    assert sorted(path.name for path in state.iterdir()) == ["checkpoint", "lock"]  # cleared, nothing left over
    with Receiver() as receiver:
        assert redrive(receiver.url, state, secret_file).returncode == 0 and not receiver.attempts  # nothing more


async def test_a_redrive_killed_mid_request_resumes_and_repeats_at_most_that_line(tmp_path: Path) -> None:
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    batches = write_letters(state, 3)
    with Receiver(["ok", "stall:30"]) as receiver:
        proc = subprocess.Popen(redrive_command(receiver.url, state, secret_file, "--timeout", "60"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            await until(lambda: len(receiver.attempts) == 2, 20, "the second line in flight")
            proc.kill()  # SIGKILL: no grace, nothing flushed
        finally:
            proc.kill()
            proc.wait(10)
        assert not (state / "dead-letter.jsonl").exists() and len(letters(state / REDRIVE_FILE)) == 3
        first_end = len((state / REDRIVE_FILE).read_bytes().splitlines(keepends=True)[0])
        assert json.loads((state / REDRIVE_OFFSET).read_text()) == {"offset": first_end}
        later = write_letters(state, 1, first=101)  # the hook ran meanwhile and dead-lettered one more
        result = redrive(receiver.url, state, secret_file)
    assert result.returncode == 0, result.stderr
    ids = [batch.delivery_id for batch in batches + later]
    assert verified_ids(receiver) == ids  # each acknowledged once, in order, the later letter last
    assert [r.headers["webhook-id"] for r in receiver.attempts] == [ids[0], ids[1], ids[1], ids[2], ids[3]]
    assert sorted(path.name for path in state.iterdir()) == ["lock"]


async def test_a_letter_that_fails_again_stays_with_the_ones_after_it(tmp_path: Path) -> None:
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    batches = write_letters(state, 3)
    with Receiver(["ok", "500", "500"]) as receiver:
        result = redrive(receiver.url, state, secret_file, "--max-attempts", "2", "--backoff-base", "0.05")
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"idled hook: fatal: redrive: delivery {batches[1].delivery_id} failed again, 2 attempts")
    assert f"stay in {state}/{REDRIVE_FILE} for the next --redrive" in line
    assert [letter["delivery"] for letter in letters(state / REDRIVE_FILE)[1:]] == \
        [batches[1].delivery_id, batches[2].delivery_id]  # (the first is behind the offset)
    with Receiver() as receiver:
        assert redrive(receiver.url, state, secret_file).returncode == 0
    assert verified_ids(receiver) == [batches[1].delivery_id, batches[2].delivery_id]


@pytest.mark.parametrize("damage, message", [
    (lambda state: (state / "dead-letter.jsonl").open("ab").write(b'{"not": "a letter"}\n'),
     "the line ending at byte"),
    (lambda state: (state / "dead-letter.jsonl").open("ab").write(b'{"torn'), "is torn"),
    # Edited or corrupted lines that json reads but the letter's fields do not survive: a seq of 1e400 (int()
    # of an infinite float: OverflowError) and a deeply nested line (RecursionError) -- one line, not a traceback.
    (lambda state: (state / "dead-letter.jsonl").open("ab").write(
        b'{"batch": {"events": [{"seq": 1e400, "ts": 1.0, "kind": "online", "uid": "u"}]}}\n'),
     "the line ending at byte"),
    (lambda state: (state / "dead-letter.jsonl").open("ab").write(b"[" * 100_000 + b"]" * 100_000 + b"\n"),
     "the line ending at byte"),
])
async def test_a_damaged_dead_letter_file_stops_the_redrive_at_that_line(tmp_path: Path, damage: object,
                                                                         message: str) -> None:
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    batches = write_letters(state, 1)
    damage(state)  # type: ignore[operator]
    with Receiver() as receiver:
        result = redrive(receiver.url, state, secret_file)
    assert result.returncode == 5 and message in result.stderr and result.stderr.count("fatal") == 1
    assert verified_ids(receiver) == [batches[0].delivery_id]  # the good line before it went, and only it
    assert (state / REDRIVE_FILE).exists()  # the damaged line is still there for the operator


async def test_an_offset_no_file_can_have_stops_the_redrive_with_one_line(tmp_path: Path) -> None:
    # An offset file edited to a number past any file (seek raises OverflowError beyond a C long): damaged,
    # nothing sent, nothing changed -- not a traceback.
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    write_letters(state, 1)
    (state / "dead-letter.jsonl").rename(state / REDRIVE_FILE)
    (state / "dead-letter.redrive.offset").write_text('{"offset": 1' + "0" * 30 + "}\n")
    with Receiver() as receiver:
        result = redrive(receiver.url, state, secret_file)
    assert result.returncode == 5 and "is not a line boundary" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stderr.count("fatal") == 1
    assert receiver.attempts == [] and (state / REDRIVE_FILE).exists()
