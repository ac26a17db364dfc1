"""A user kicked through the HTTP API (`POST /v1/kick` with a reason) sees the reason once, behind the code:
``kicked: account suspended``, not ``kicked: kicked: account suspended`` -- a real daemon, a real `idled user`."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests import peers
from tests.cli.test_operator import IDLED, LiveDaemon

pytestmark = pytest.mark.slow


def _kick(api_port: int, body: dict[str, str]) -> dict[str, int]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{api_port}/v1/kick", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with opener.open(request, timeout=10) as response:
        answer: dict[str, int] = json.loads(response.read())
        return answer


@pytest.mark.parametrize(("body", "expected"), [
    ({"uid": "mallory", "reason": "account suspended"}, "idled user: kicked: account suspended"),
    ({"uid": "mallory"}, "idled user: kicked: ended by the server's operator"),
])
def test_a_kicked_user_reads_the_code_once_and_the_reason(tmp_path: Path, body: dict[str, str],
                                                          expected: str) -> None:
    api_port = peers.free_port()
    daemon = LiveDaemon(tmp_path, "--api-port", str(api_port))
    user = subprocess.Popen([*IDLED, "user", "mallory", "--quiet", *daemon.client_flags()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert user.stdout is not None
        assert "logged in as 'mallory'" in user.stdout.readline()
        deadline = time.monotonic() + 10
        while _kick(api_port, body) != {"ended": 1}:  # the login's online is published before the welcome
            assert time.monotonic() < deadline, "the user never showed up online"
            time.sleep(0.05)
        _, err = user.communicate(timeout=20)
    finally:
        if user.poll() is None:
            user.kill()
        daemon.stop()
    assert user.returncode == 1
    assert err.strip().splitlines() == [expected]
