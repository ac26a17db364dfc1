from __future__ import annotations

import time
from pathlib import Path

import pytest

from idled.cli.main import main
from idled.protocol.tokens import verify_bearer


def test_idled_token_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"q" * 32)
    assert main(["token", "--secret-file", str(secret), "--api", "ops"]) == 0
    token = capsys.readouterr().out.strip()
    assert verify_bearer(b"q" * 32, token, "api", time.time()) == "ops"
