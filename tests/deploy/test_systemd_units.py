"""systemd/idled.service and idled.socket: systemd's own checker, its security rating, and the sandbox.

`systemd-analyze verify` loads the units the way the manager would (it needs no running systemd)
and reports problems as messages while still exiting 0 for many of them (an unknown key is
"ignoring", not an error), so the tests require both exit status 0 *and* no output.

It also insists that every Exec*= binary exists and is executable. The unit names
/usr/local/bin/idled, which is not installed on a build machine, so verify runs on a temporary copy
of both units in which only that path is replaced by an executable stub (the arguments stay).
Alternatives tried: `--root=DIR` makes verify resolve everything -- sysinit.target, /bin/kill -- under
DIR, so it would need a whole systemd tree copied in; checking the installed unit would need the
package installed. The stub copy checks every line of the real file except one path, and the test
asserts that the copy differs from the original in exactly that.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from idled.ops import systemd

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
SERVICE = UNITS / "idled.service"
SOCKET = UNITS / "idled.socket"
EXECUTABLE = "/usr/local/bin/idled"
MAX_EXPOSURE = 2.5

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not found on PATH (Debian: apt-get install systemd; see .ci/system-deps)"
)


def directives(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> values in order (unit files repeat keys, so configparser will not do)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, val = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(val.strip())
    return out


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "--no-pager", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_COLORS": "0"},
    )


def stub_copy(tmp_path: Path) -> tuple[Path, Path]:
    """Both units in tmp_path, ExecStart's binary replaced by an executable stub."""
    stub = tmp_path / "idled-stub"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    original = SERVICE.read_text()
    copy = original.replace(f"ExecStart={EXECUTABLE} ", f"ExecStart={stub} ")
    changed = [(a, b) for a, b in zip(original.splitlines(), copy.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith(f"ExecStart={EXECUTABLE} "), changed
    service = tmp_path / "idled.service"
    service.write_text(copy)
    socket_unit = tmp_path / "idled.socket"
    shutil.copyfile(SOCKET, socket_unit)
    return service, socket_unit


# --- systemd-analyze ---------------------------------------------------------------------------


@needs_analyze
def test_verify_passes(tmp_path: Path) -> None:
    service, socket_unit = stub_copy(tmp_path)
    result = analyze("verify", "--man=no", str(socket_unit), str(service))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr


@needs_analyze
def test_verify_catches_what_the_test_relies_on_it_to_catch(tmp_path: Path) -> None:
    # Guards the two assumptions above: warnings do appear in the output, and a missing binary fails.
    service, socket_unit = stub_copy(tmp_path)
    service.write_text(service.read_text().replace("WatchdogSec=30", "WatchdogSecs=30"))
    typo = analyze("verify", "--man=no", str(socket_unit), str(service))
    assert "Unknown key" in typo.stdout + typo.stderr
    shutil.copyfile(SERVICE, service)  # the real ExecStart path, not installed here
    missing = analyze("verify", "--man=no", str(socket_unit), str(service))
    if Path(EXECUTABLE).exists():
        pytest.skip(f"{EXECUTABLE} is installed on this machine")
    assert missing.returncode != 0 and EXECUTABLE in missing.stdout + missing.stderr


@needs_analyze
def test_security_exposure_is_low() -> None:
    result = analyze("security", "--offline=yes", str(SERVICE))
    match = re.search(r"Overall exposure level for idled\.service:\s*([0-9.]+)\s+(\S+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security: {exposure} {match.group(2)}")
    assert exposure <= MAX_EXPOSURE, result.stdout


# --- the unit says what the daemon and the docs assume -----------------------------------------


def test_service_directives() -> None:
    unit = directives(SERVICE)
    expected = {
        "Service.Type": ["notify"],
        "Service.NotifyAccess": ["main"],
        "Service.ExecStart": [f"{EXECUTABLE} serve --config /etc/idled/idled.toml"],
        "Service.ExecReload": ["/bin/kill -HUP $MAINPID"],
        "Service.WatchdogSec": ["30"],
        "Service.Restart": ["on-failure"],
        "Service.TimeoutStopSec": ["30"],
        "Service.KillSignal": ["SIGTERM"],
        "Service.LimitNOFILE": ["1048576"],
        "Service.StateDirectory": ["idled"],
        "Service.DynamicUser": ["yes"],
        "Service.MemoryDenyWriteExecute": ["yes"],
        "Service.CapabilityBoundingSet": [""],
        "Service.AmbientCapabilities": [""],
        "Service.RestrictAddressFamilies": ["AF_INET AF_INET6 AF_UNIX"],
        "Service.UMask": ["0077"],
        "Service.ProtectSystem": ["strict"],
        "Service.ProtectProc": ["invisible"],
        "Unit.Requires": ["idled.socket"],
    }
    for key, values in expected.items():
        assert unit.get(key) == values, key
    assert unit["Service.SystemCallFilter"][0] == "@system-service"
    # ProcSubset=pid would hide /proc/stat, and prometheus-client's process collector (the fd alert's
    # source) exports nothing without it.
    assert "Service.ProcSubset" not in unit


def test_watchdog_pings_at_half_the_unit_interval() -> None:
    (watchdog_sec,) = directives(SERVICE)["Service.WatchdogSec"]
    env = {"WATCHDOG_USEC": str(int(watchdog_sec) * 1_000_000), "WATCHDOG_PID": str(os.getpid())}
    assert systemd.watchdog_interval(env) == int(watchdog_sec) / 2


def test_socket_directives() -> None:
    unit = directives(SOCKET)
    assert unit["Socket.ListenStream"] == ["127.0.0.1:7878"]
    assert unit["Socket.Service"] == ["idled.service"]
    assert unit["Socket.FileDescriptorName"] == ["idled"]
    assert unit["Install.WantedBy"] == ["sockets.target"]


# --- MemoryDenyWriteExecute=yes with the real interpreter and libraries --------------------------


# Runs under the kernel's MDWE (Linux >= 6.3): the same rule systemd's MemoryDenyWriteExecute=
# enforces with seccomp -- no mapping may be writable and executable, none may gain exec later.
MDWE_CHILD = r"""
import ctypes, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(66, 0, 0, 0, 0) == 1, "MDWE not inherited"
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W+X mapping allowed: the sandbox is not in force")
except OSError:
    pass
import msgpack, psutil, trio
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from idled.door.door import Door, Endpoint, metrics_gate
from idled.ops import systemd
from idled.ops.http import serve_metrics
from idled.ops.metrics import Metrics

assert msgpack.unpackb(msgpack.packb({"uid": 1, "k": [1.5, b"x"]})) == {"uid": 1, "k": [1.5, b"x"]}
psutil.Process().memory_info()
systemd.raise_nofile_limit()

async def main():
    registry = CollectorRegistry()
    Metrics(registry, tick=1.0).register_snapshot(lambda: {"sessions_online": 1})
    async with trio.open_nursery() as nursery:
        door = Door([Endpoint("metrics", "127.0.0.1", 0)], secret=False, insecure=False, env={})
        port = await nursery.start(serve_metrics, registry, await door.open("metrics"), metrics_gate())
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
        body = data.partition(b"\r\n\r\n")[2].decode()
        names = {f.name for f in text_string_to_metric_families(body)}
        assert "idled_sessions_online" in names and "process_open_fds" in names, names
        nursery.cancel_scope.cancel()

trio.run(main)
print("ok")
"""

MDWE_SHIM = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    print("unsupported", ctypes.get_errno(), flush=True)
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MDWE is a Linux feature")
def test_cpython_and_dependencies_run_with_memory_deny_write_execute() -> None:
    result = subprocess.run(
        [sys.executable, "-c", MDWE_SHIM, MDWE_CHILD], capture_output=True, text=True, timeout=120
    )
    if result.stdout.startswith("unsupported"):
        pytest.skip(f"kernel without PR_SET_MDWE (Linux >= 6.3 needed): {os.uname().release}")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


# --- systemd/idled-hook.service -----------------------------------------------------------------------

HOOK = UNITS / "idled-hook.service"


def hook_stub_copy(tmp_path: Path) -> Path:
    """idled-hook.service in tmp_path with ExecStart's binary replaced by an executable stub (as stub_copy)."""
    stub = tmp_path / "idled-stub"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    original = HOOK.read_text()
    copy = original.replace(f"ExecStart={EXECUTABLE} ", f"ExecStart={stub} ")
    changed = [(a, b) for a, b in zip(original.splitlines(), copy.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith(f"ExecStart={EXECUTABLE} hook "), changed
    unit = tmp_path / "idled-hook.service"
    unit.write_text(copy)
    return unit


@needs_analyze
def test_hook_unit_verify_passes(tmp_path: Path) -> None:
    result = analyze("verify", "--man=no", str(hook_stub_copy(tmp_path)))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr


@needs_analyze
def test_hook_unit_security_exposure_is_low() -> None:
    result = analyze("security", "--offline=yes", str(HOOK))
    match = re.search(r"Overall exposure level for idled-hook\.service:\s*([0-9.]+)\s+(\S+)", result.stdout)
    assert match, result.stdout + result.stderr
    print(f"systemd-analyze security (hook): {match.group(1)} {match.group(2)}")
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_hook_unit_runs_the_documented_command() -> None:
    unit = directives(HOOK)
    (exec_start,) = unit["Service.ExecStart"]
    argv = exec_start.split()
    assert argv[:2] == [EXECUTABLE, "hook"]
    assert {"--url", "--state", "--hook-secret-file"} <= set(argv)
    from tests.cli.test_help_docs import flags_of

    assert {arg for arg in argv if arg.startswith("--")} <= flags_of("hook")
    assert unit["Service.Restart"] == ["on-failure"] and unit["Service.RestartPreventExitStatus"] == ["2"]
    assert unit["Service.StateDirectory"] == ["idled-hook"] and "/var/lib/idled-hook" in argv
    assert unit["Service.DynamicUser"] == ["yes"] and unit["Service.MemoryDenyWriteExecute"] == ["yes"]
