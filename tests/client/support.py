"""Test support for the client library: a restartable `idled serve` subprocess on a fixed loopback port.

Synchronous on purpose, so trio tests and asyncio tests (which run `asyncio.run` inside a sync test) share it.
Restarts keep the port and the data dir: clients reconnect to the same address and the event log continues.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests import peers

TICK = 0.1
TIMEOUT = 1.0
HOST = "127.0.0.1"


class Idled:
    """`idled serve --tick 0.1 --timeout 1` on a free port; `start()`, `stop()`, `restart()`."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"
        self.extra = extra
        self.port = peers.free_port()
        self.daemon: peers.Daemon | None = None
        self.runs = 0

    def start(self, timeout: float = 20.0) -> Idled:
        command = peers.serve_command(
            self.data_dir, "--metrics-port", "0", "--tick", str(TICK), "--timeout", str(TIMEOUT),
            "--fsync", "never", *self.extra, "--port", str(self.port),
        )
        self.runs += 1
        daemon = peers.Daemon(command, self.tmp_path / f"idled-{self.runs}.stderr")
        self.daemon = daemon
        limit = time.monotonic() + timeout
        while "IDLED_LISTENING" not in daemon.stderr():
            assert daemon.proc.poll() is None, f"idled exited early:\n{daemon.stderr()}"
            assert time.monotonic() < limit, "idled did not start listening"
            time.sleep(0.02)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.daemon is not None
        self.daemon.proc.send_signal(sig)
        return self.daemon.proc.wait(20)

    def restart(self) -> None:
        assert self.stop() == 0
        self.start()

    def kill(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()
