"""`idled token`: mint a token from the command line."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from idled.cli import token as token_cmd
from idled.protocol.tokens import AuthError, load_secret, verify


def run_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="idled token")
    token_cmd.add_arguments(parser)
    status = token_cmd.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_token_command_prints_a_token_that_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("a-real-secret-of-more-than-16-bytes\n")
    secret = load_secret(secret_file)
    before = time.time()
    status, out, err = run_command(["--secret-file", str(secret_file), "--uid", "42", "--ttl", "600"], capsys)
    assert (status, err) == (0, "")
    token = out.strip()
    assert out == token + "\n"
    verify(secret, token, "uid", 42, now=time.time())
    verify(secret, token, "uid", "42", now=before + 598)
    with pytest.raises(AuthError, match="expired"):
        verify(secret, token, "uid", 42, now=time.time() + 601)

    for flag, role in (("--gateway", "gateway"), ("--observer", "observer"), ("--standby", "standby")):
        status, out, _ = run_command(["--secret-file", str(secret_file), flag, "edge-1"], capsys)
        assert status == 0
        verify(secret, out.strip(), role, "edge-1", now=time.time() + 86400 - 5)  # default ttl: one day
        for other in {"uid", "observer", "standby"} - {role}:  # a token of one role logs in as no other
            with pytest.raises(AuthError, match="login, not"):
                verify(secret, out.strip(), other, "edge-1", now=time.time())


def test_token_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_command(["--secret-file", str(tmp_path / "nope"), "--uid", "a"], capsys)
    assert status == 2 and out == "" and "cannot read secret file" in err
    short = tmp_path / "short"
    short.write_text("tiny\n")
    status, out, err = run_command(["--secret-file", str(short), "--uid", "a"], capsys)
    assert status == 2 and out == "" and "at least 16" in err
    good = tmp_path / "good"
    good.write_text("a-real-secret-of-more-than-16-bytes")
    status, out, err = run_command(["--secret-file", str(good), "--uid", ""], capsys)
    assert status == 2 and out == "" and "1..256" in err
    for argv in (["--secret-file", str(good)],  # no identity
                 ["--secret-file", str(good), "--uid", "a", "--gateway", "g"],  # two identities
                 ["--secret-file", str(good), "--uid", "a", "--ttl", "0"],
                 ["--secret-file", str(good), "--uid", "a", "--ttl", "soon"],
                 ["--uid", "a"]):  # no secret
        with pytest.raises(SystemExit) as info:
            run_command(argv, capsys)
        assert info.value.code == 2
