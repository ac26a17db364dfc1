"""The MQTT peer of `idled loadtest --peer mqtt`: a Mosquitto broker of its own, on loopback, for one run.

Theory of operation
-------------------
`find_mosquitto` looks for the binary on PATH and then in the sbin directories Debian's package installs it to
(``/usr/sbin/mosquitto``; a non-root PATH often lacks them). `spawn_mosquitto` writes a configuration into a
fresh temporary directory -- one listener on 127.0.0.1 at a port that was free a moment ago, anonymous clients
allowed, no persistence, ``max_keepalive`` 65535 (the largest an MQTT keepalive can be, so no keepalive the
run asks for is refused), no connection limit, the log to a file in that directory, and ``user`` = whoever
runs us (a root Mosquitto otherwise switches to the ``mosquitto`` user, who cannot write there) -- starts
``mosquitto -c FILE`` with the soft open-file limit raised to the hard one (every client is a descriptor),
and waits until the port accepts a connection. It is never the system's service: nothing is read from
/etc/mosquitto, and the process is ours, stopped with SIGTERM at the end like a spawned idled
(`idled.tools.loadtest.target.stop_server`); the directory goes with the run.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Final

import trio

from idled.tools.loadtest.target import ServerProcess, free_port, scratch_directory, stop_server

__all__ = ["SBIN", "find_mosquitto", "mosquitto_version", "config_text", "spawn_mosquitto"]

SBIN: Final = ("/usr/sbin", "/usr/local/sbin", "/sbin")
STARTUP_TIMEOUT: Final = 15.0


def find_mosquitto() -> str | None:
    """The mosquitto binary: on PATH, else in an sbin directory (where Debian puts it)."""
    return shutil.which("mosquitto") or shutil.which("mosquitto", path=os.pathsep.join(SBIN))


def mosquitto_version(binary: str) -> str:
    """``mosquitto version 2.0.11`` -> ``2.0.11`` (``?`` if it does not say)."""
    try:
        out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1] if first.startswith("mosquitto version") else "?"


def config_text(port: int, log_file: str, user: str) -> str:
    """The broker's whole configuration (see the module docstring)."""
    return "\n".join([
        "# written by idled loadtest --peer mqtt for one run",
        f"listener {port} 127.0.0.1",
        "allow_anonymous true",
        "persistence false",
        "max_keepalive 65535",
        "max_connections -1",
        f"user {user}",
        f"log_dest file {log_file}",
        "",
    ])


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def spawn_mosquitto(nursery: trio.Nursery, binary: str | None = None) -> ServerProcess:
    """Start a broker of our own and return once it accepts connections (RuntimeError, with the last line of
    its log, if it does not)."""
    binary = binary or find_mosquitto()
    if binary is None:
        raise RuntimeError("mosquitto not found (on PATH or in /usr/sbin): install Debian's mosquitto package "
                           "(.ci/system-deps does)")
    directory = scratch_directory(nursery, "idled-loadtest-mqtt-")
    port, conf, log_file = _configure(directory)
    argv = [binary, "-c", conf]
    output = os.path.join(directory, "output.log")  # (what it says before its log file is open)
    with open(output, "wb") as out:  # noqa: ASYNC230 (once, before the run)
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_raise_nofile)
    server = ServerProcess("127.0.0.1", port, process.pid, argv, process)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline and process.returncode is None:
        if _accepts(port):
            return server
        await trio.sleep(0.05)
        process.poll()
    await stop_server(server, grace=2.0)
    raise RuntimeError(f"mosquitto did not listen on 127.0.0.1:{port} (exit status {process.returncode}): "
                       f"{_last_words(log_file, output)}")


def _configure(directory: str) -> tuple[int, str, str]:
    """(port, configuration file, log file) of a broker in ``directory`` (blocking, but a few bytes, once)."""
    port = free_port()
    log_file = os.path.join(directory, "mosquitto.log")
    conf = Path(directory, "mosquitto.conf")
    conf.write_text(config_text(port, log_file, pwd.getpwuid(os.getuid()).pw_name), encoding="utf-8")
    return port, str(conf), log_file


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _last_words(*files: str) -> str:
    """The last non-empty line of the first of ``files`` that has one."""
    for name in files:
        try:
            lines = Path(name).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        last = next((line.strip() for line in reversed(lines) if line.strip()), None)
        if last:
            return last
    return "no output"

