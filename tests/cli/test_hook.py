"""`idled hook`'s flags: usage errors are one line and status 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from idled.cli import main as cli
from idled.hook.runner import start_position


@pytest.mark.parametrize("extra, message", [
    ([], "--hook-secret-file is required"),
    (["--insecure-unsigned", "--url", "ftp://x/"], "expected http"),
    (["--insecure-unsigned", "--from", "0"], "--from must be at least 1"),
    (["--insecure-unsigned", "--filter", "kind=away"], "kind is online or offline"),
    (["--insecure-unsigned", "--batch-wait", "0"], "--batch-wait must be a positive"),
    (["--insecure-unsigned", "--max-attempts", "-1"], "--max-attempts"),
    (["--insecure-unsigned", "--retry-for", "-5"], "--retry-for must be >= 0 seconds"),
    (["--insecure-unsigned", "--retry-for", "nan"], "--retry-for must be >= 0 seconds"),
    (["--hook-secret-file", "/nonexistent"], "cannot read secret file"),
    (["--hook-secret-file", "NOT-WHSEC"], "not a Standard Webhooks secret (whsec_<base64>); make one with printf"),
])
def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    (tmp_path / "NOT-WHSEC").write_text("hook-test-secret-0123456789abcdef\n")  # long enough, not base64
    extra = [str(tmp_path / word) if word == "NOT-WHSEC" else word for word in extra]
    argv = ["hook", "--url", "http://127.0.0.1:1/", "--state", str(tmp_path / "state"), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("idled hook: ") and message in err and err.count("\n") == 1


def test_where_the_stream_starts() -> None:
    assert start_position(7, None) == (7, "resuming after checkpoint seq 7")
    after, why = start_position(7, 1)
    assert after == 7 and "--from 1 ignored" in why
    assert start_position(None, 5)[0] == 4
    assert start_position(None, None)[0] is None


def test_a_locked_state_dir_is_one_fatal_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from idled.hook.state import StateDir

    holder = StateDir(str(tmp_path))
    try:
        status = cli.main(["hook", "--url", "http://127.0.0.1:1/", "--state", str(tmp_path), "--insecure-unsigned",
                           "--port", "1"])
    finally:
        holder.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 5 and err.startswith(f"idled hook: fatal: state directory ({tmp_path}): locked by another")


def test_a_redrive_beside_a_running_hook_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from idled.hook.state import StateDir

    holder = StateDir(str(tmp_path))  # as a running hook holds it
    try:
        status = cli.main(["hook", "--redrive", "--url", "http://127.0.0.1:1/", "--state", str(tmp_path),
                           "--insecure-unsigned"])
    finally:
        holder.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 5 and "locked by another idled hook" in err
