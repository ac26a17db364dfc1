"""The one exit-status table, checked against real failures of every command (real subprocesses).

Each case runs `python -m idled.cli.main ...` and checks the status and that stderr is exactly one line
with no traceback: what a supervisor or a script sees. The table itself (`EXIT_STATUS_HELP`) must be in every
command's --help and in docs/operations.md.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from idled.cli import main as cli
from idled.ops import fatal

from tests import peers

ROOT = Path(__file__).resolve().parents[2]
IDLED = [sys.executable, "-m", "idled.cli.main"]


def _cases(tmp: Path, dead_port: int, busy_port: int) -> list[tuple[str, list[str], int]]:
    short_secret = tmp / "short-secret"
    short_secret.write_text("too short\n")
    not_a_dir = tmp / "file"
    not_a_dir.write_text("")
    dead = ["--port", str(dead_port), "--connect-timeout", "2"]
    return [
        ("no command", [], 2),
        ("unknown command", ["frobnicate"], 2),
        ("serve bad flag", ["serve", "--bogus"], 2),
        ("serve bad value", ["serve", "--tick", "5", "--timeout", "1", "--data-dir", str(tmp / "d1")], 2),
        ("serve port in use", ["serve", "--port", str(busy_port), "--metrics-port", "0", "--data-dir", str(tmp / "d2")], 4),
        ("serve data dir is a file", ["serve", "--port", "0", "--metrics-port", "0", "--data-dir", str(not_a_dir)], 5),
        ("check-config bad value", ["check-config", "--detector", "nope"], 2),
        ("check-config bad range", ["check-config", "--port", "70000"], 2),
        ("check-config insecure", ["check-config", "--host", "0.0.0.0"], 2),
        ("check-config data dir is a file", ["check-config", "--data-dir", str(not_a_dir)], 2),
        ("user bad flag", ["user", "alice", "--bogus"], 2),
        ("user no uid", ["user"], 2),
        ("user unreachable", ["user", "alice", *dead], 1),
        ("user unusable secret", ["user", "alice", "--secret-file", str(short_secret), *dead], 2),
        ("watch bad flag", ["watch", "--bogus"], 2),
        ("watch bad --from", ["watch", "--from", "0"], 2),
        ("watch unreachable", ["watch", *dead], 1),
        ("query bad flag", ["query", "alice", "--bogus"], 2),
        ("query unreachable", ["query", "alice", *dead], 1),
        ("query --int not int", ["query", "--int", "alice"], 2),
        ("status bad flag", ["status", "--bogus"], 2),
        ("status bad address", ["status", "--metrics", "nowhere"], 2),
        ("status unreachable", ["status", "--metrics", f"127.0.0.1:{dead_port}", "--timeout", "2"], 1),
        ("token bad flag", ["token", "--bogus"], 2),
        ("token unusable secret", ["token", "--secret-file", str(short_secret), "--uid", "a"], 2),
        ("events bad flag", ["events", "--bogus"], 2),
        ("events no such dir", ["events", "--data-dir", str(tmp / "missing")], 2),
        ("bench bad flag", ["bench", "--bogus"], 2),
        ("loadtest bad flag", ["loadtest", "--bogus"], 2),
        ("pipeline bad flag", ["pipeline", "--bogus"], 2),
    ]


@pytest.mark.slow
def test_every_command_fails_with_its_status_and_one_line(tmp_path: Path) -> None:
    dead_port = peers.free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cases = _cases(tmp_path, dead_port, busy.getsockname()[1])

        def run(case: tuple[str, list[str], int]) -> tuple[str, int, int, str]:
            name, argv, expected = case
            done = subprocess.run([*IDLED, *argv], capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL)
            return name, expected, done.returncode, done.stderr

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(run, cases))
    problems = []
    for name, expected, status, stderr in results:
        lines = [line for line in stderr.splitlines() if line.strip()]
        if name.startswith("serve ") and expected > 2:  # the daemon logs its start-up lines first; then one fatal line, last
            lines = [line for line in lines if "INFO" not in line]
            if lines and not lines[-1].startswith("idled: fatal: "):
                lines.append("(no fatal line last)")
        if status != expected or len(lines) != 1 or "Traceback" in stderr:
            problems.append(f"{name}: status {status} (want {expected}), stderr {stderr!r}")
    assert not problems, "\n".join(problems)


def test_the_table_names_every_status_fatal_defines() -> None:
    codes = {value for name, value in vars(fatal).items() if name.startswith("EXIT_")}
    listed = {int(m) for m in re.findall(r"^  (\d+) ", cli.EXIT_STATUS_HELP, re.M)}
    assert listed == codes


def test_every_help_and_the_docs_carry_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    for name in [None, *cli.COMMANDS]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--help"] if name is None else [name, "--help"])
        assert exit_info.value.code == 0
        assert cli.EXIT_STATUS_HELP in capsys.readouterr().out, name
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert cli.EXIT_STATUS_HELP in operations, "docs/operations.md must quote main.EXIT_STATUS_HELP verbatim"


def test_version_on_idled_and_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    from idled import __version__

    for argv in (["--version"], *([name, "--version"] for name in cli.COMMANDS)):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.strip() == f"idled {__version__}"
