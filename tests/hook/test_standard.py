"""Standard Webhooks, checked by a verifier nobody here wrote: PyPI's `standardwebhooks`.

Real parts: an `idled serve` subprocess, events made through a gateway, `idled hook` as a subprocess, and the
receivers on 127.0.0.1 -- the Python receiver of docs/hook.md run as it is printed there (a subprocess), and
the scripted receiver of `tests.hook.receiver`, whose every attempt (failures and retries included) is
verified with ``Webhook(secret).verify(body, headers)``.
"""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from standardwebhooks import Webhook

from tests import peers
from tests.hook.helpers import WHSEC, Hook, gateway_events, hook_command, log_records, until
from tests.hook.receiver import Receiver

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "hook.md"


def documented_receiver() -> str:
    """The Python block under "Verifying in Python (tested)" in docs/hook.md."""
    text = DOC.read_text()
    match = re.search(r"### Verifying in Python \(tested\).*?```python\n(.*?)```", text, re.S)
    assert match, "docs/hook.md lost its tested Python receiver"
    return match.group(1)


def daemon(tmp_path: Path, port: int) -> peers.Daemon:
    command = peers.serve_command(tmp_path / "data", "--fsync", "always", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    return peers.Daemon(command, tmp_path / "daemon.stderr")


async def listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while True:
            assert proc.poll() is None, "the receiver exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                await trio.sleep(0.05)


async def test_the_documented_python_receiver_verifies_every_delivery(tmp_path: Path) -> None:
    script, secret_file = tmp_path / "receiver.py", tmp_path / "hook-secret"
    script.write_text(documented_receiver())
    secret_file.write_text(WHSEC + "\n")
    receiver_port, port = peers.free_port(), peers.free_port()
    out, err = tmp_path / "receiver.out", tmp_path / "receiver.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        receiver = subprocess.Popen([sys.executable, str(script), str(receiver_port), str(secret_file)],
                                    stdout=stdout, stderr=stderr)
    try:
        await listening(receiver_port, receiver)
        async with daemon(tmp_path, port):
            hook = Hook(hook_command(f"http://127.0.0.1:{receiver_port}/hook", port, tmp_path / "state",
                                     secret_file, "--from", "1", "--batch-max", "7"), tmp_path / "hook.stderr")
            try:
                await gateway_events(port, [f"u{i}" for i in range(30)])  # 30 onlines, 30 offlines (15 detached, 15 at the end)
                printed = lambda: [int(line.split()[0]) for line in out.read_text().splitlines()]  # noqa: E731
                await until(lambda: len(printed()) >= 60, 20, f"the receiver stored every event:\n{hook.stderr()}")
                expected = [record["seq"] for record in log_records(tmp_path / "data")]
            finally:
                hook.kill()
    finally:
        receiver.kill()
        receiver.wait(10)
    assert printed() == expected and len(expected) == 60, "every event once, in seq order"
    assert "refused" not in err.read_text()
    assert "HTTP 401" not in hook.stderr()  # no request was refused, retried or not


async def test_every_attempt_verifies_and_a_retry_keeps_its_webhook_id(tmp_path: Path) -> None:
    secret_file = tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    port = peers.free_port()
    with Receiver(["500", "reset", "503:0", "ok", "500"]) as receiver:
        async with daemon(tmp_path, port):
            hook = Hook(hook_command(receiver.url, port, tmp_path / "state", secret_file, "--from", "1",
                                     "--batch-max", "5", "--backoff-base", "0.05"), tmp_path / "hook.stderr")
            try:
                await gateway_events(port, [f"r{i}" for i in range(6)])
                last = log_records(tmp_path / "data")[-1]["seq"]
                await until(lambda: any(e["seq"] == last for e in receiver.acked_events()), 20, "every event")
            finally:
                hook.kill()
    webhook = Webhook(WHSEC)
    for request in receiver.attempts:
        request.headers = {name.lower(): value for name, value in request.headers.items()}
        body = webhook.verify(request.body, request.headers)  # raises WebhookVerificationError
        assert request.headers["webhook-id"] == f"{body['first_seq']}-{body['last_seq']}"
        assert abs(int(request.headers["webhook-timestamp"]) - request.received) < 5
    ids = [request.headers["webhook-id"] for request in receiver.attempts]
    assert ids[:4] == [ids[0]] * 4 and ids[0] != ids[4] == ids[5]  # 3 failures and the 2xx; the next batch twice
    assert [request.body for request in receiver.attempts[:4]] == [receiver.attempts[0].body] * 4
    assert [request.headers["idled-attempt"] for request in receiver.attempts[:4]] == ["1", "2", "3", "4"]
    tampered = dict(receiver.attempts[0].headers, **{"webhook-id": "1-999"})
    with pytest.raises(Exception, match="No matching signature"):
        webhook.verify(receiver.attempts[0].body, tampered)
    wrong = Webhook(base64.b64encode(b"another secret, 32 bytes long!!!").decode())
    with pytest.raises(Exception, match="No matching signature"):
        wrong.verify(receiver.attempts[0].body, receiver.attempts[0].headers)
