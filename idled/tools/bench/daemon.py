"""The `idled serve` subprocess a benchmark measures: started, found listening, sampled, stopped.

Theory of operation
-------------------
``Daemon(directory, *flags)`` runs ``python -m idled.cli.main serve --port 0 --data-dir DIRECTORY/data FLAGS``
(the flags come last, so they win) with stdin and stdout on /dev/null and stderr in ``DIRECTORY/serve.stderr``:
a file, not a pipe, so a daemon that logs a lot never blocks on a reader the benchmark forgot -- a stall of
our making in what is measured. The constructor polls that file until a line starts with
``IDLED_LISTENING host=H port=P`` (`idled.tools.loadtest.target.LISTENING_RE`; anchored at the line's start,
so an edge's line behind ``worker-<i>:`` under ``--workers`` is not taken for the core's) and sets ``port``;
if the daemon exits first, or does not listen within ``timeout``, it is killed and RuntimeError carries the
tail of its stderr. ``cpu`` is its `psutil.Process`, ``cpu_seconds()`` its user + system CPU time so far.
``stop()`` (also on leaving a ``with`` block) sends SIGTERM, waits ``grace`` seconds, then SIGKILLs; the
module's `stop(proc)` does the same for any other subprocess a benchmark starts (e.g. ``idled hook``).

Synchronous on purpose: the benchmarks drive the daemon from plain threads and sockets (or block for it
briefly at the start of a trio run); `idled.tools.loadtest.target.spawn_server` is the trio-based sibling
for the load generator, which drains a pipe inside its nursery.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import psutil

from idled.tools.loadtest.target import LISTENING_RE, free_port

__all__ = ["Daemon", "free_port", "stop"]


class Daemon:
    """`idled serve` in a subprocess, listening once constructed; ``port`` from its IDLED_LISTENING line."""

    def __init__(self, directory: Path, *flags: str, timeout: float = 30.0, command: list[str] | None = None) -> None:
        """``command``: another idled command line that prints IDLED_LISTENING (``idled edge``), instead of serve."""
        self.stderr_path = directory / ("serve.stderr" if command is None else "command.stderr")
        if command is None:
            command = [sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--data-dir",
                       str(directory / "data"), *flags]
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        self.cpu = psutil.Process(self.proc.pid)
        try:
            self.port = self._listening(timeout)
        except BaseException:
            self.stop(grace=0)
            raise

    def _listening(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stderr().splitlines():
                if m := LISTENING_RE.match(line):
                    return int(m.group(2))
            if self.proc.poll() is not None:
                raise RuntimeError(f"idled serve exited (status {self.proc.returncode}): {self.stderr()[-2000:]}")
            time.sleep(0.02)
        raise RuntimeError(f"idled serve did not listen within {timeout:g} s: {self.stderr()[-2000:]}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        """User + system CPU time the daemon has used so far."""
        times = self.cpu.cpu_times()
        return float(times.user + times.system)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; a no-op once it has exited."""
        stop(self.proc, grace)

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL (and reap); a no-op once it has exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
