"""What the hook's end-to-end tests share: an `idled hook` subprocess, events made through a gateway, the log."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from idled.client.trio import open_gateway
from idled.log.eventlog import iter_records

WHSEC = "whsec_" + base64.b64encode(b"idled hook test secret, 32 bytes").decode()  # Standard Webhooks' form
SECRET = WHSEC.encode()  # the secret file's bytes


def hook_command(url: str, port: int, state: Path, secret_file: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "idled.cli.main", "hook", "--url", url, "--port", str(port), "--state", str(state),
            "--hook-secret-file", str(secret_file), "--log-level", "debug", *options]


class Hook:
    """An `idled hook` subprocess, stderr to a file."""

    def __init__(self, command: list[str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        with open(stderr_path, "ab") as stderr:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def subscribed(self, count: int = 1, timeout: float = 20.0) -> None:
        with trio.fail_after(timeout):
            while self.stderr().count("subscribed to") < count:
                assert self.proc.poll() is None, f"idled hook exited early:\n{self.stderr()}"
                await trio.sleep(0.02)

    async def wait(self, timeout: float = 20.0) -> int:
        return await trio.to_thread.run_sync(self.proc.wait, timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def gateway_events(port: int, uids: Sequence[str], name: str = "gw") -> None:
    """Attach ``uids`` (one online each), then detach every other one (offline, reason detach)."""
    async with open_gateway("127.0.0.1", port, name, reconnect=False) as gateway:
        await gateway.attach(uids, keepalive=60)
        await gateway.flush()
        await gateway.detach(uids[::2])
        await gateway.flush()
        await trio.sleep(0.05)


def log_records(data_dir: Path) -> list[dict[str, Any]]:
    return [dict(record) for record in iter_records(str(data_dir))]


def checkpoint(state: Path) -> int | None:
    try:
        return int(json.loads((state / "checkpoint").read_text())["seq"])
    except FileNotFoundError:
        return None


async def until(predicate: Any, timeout: float, what: str) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
    assert predicate(), what
