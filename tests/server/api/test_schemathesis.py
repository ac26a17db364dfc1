"""The API and its OpenAPI document agree: Schemathesis, a tool nobody here wrote, reads the document a live
daemon serves and sends it what the document allows (and, in negative mode, what it forbids), and every check
it has passes.

A real ``idled serve`` with a secret (auth on), its document fetched with an api token; Schemathesis' CLI run
as a subprocess (its command line is the interface its project keeps stable; the Python API moved between
3.x and 4.x) with the token given through the document's own security scheme (``[auth.openapi.bearer]`` in
its config file), ``--checks all --mode all`` (negative data, missing auth, unsupported methods included),
bounded (``MAX_EXAMPLES`` per operation per phase) and deterministic (``--generation-deterministic``: the
same cases every run, no example database). A failure prints Schemathesis' report: each failing case with a
curl command that reproduces it.

Strings are generated in ASCII (``--generation-codec ascii``). The API's lengths are the protocol's, in UTF-8
bytes (a uid 1..256, a device 1..64, a reason 0..256); JSON Schema counts characters, so the document's
``maxLength`` is exact for ASCII and only necessary beyond it: 37 four-byte characters are a schema-valid
device of 148 bytes, and a byte-exact pattern is no regular expression anyone could read. The byte limits of
non-ASCII text are tested exactly in tests/server/api/test_request.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio

from idled.protocol.tokens import mint
from tests import peers

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 200  # per operation and phase: ~10 s on this box for the five operations
SECRET = b"k" * 32
CONFIG = '[auth.openapi.bearer]\nbearer = "${IDLED_TEST_API_TOKEN}"\n'  # the document's scheme, named "bearer"


def _document(port: int, token: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/openapi.json",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return bytes(response.read())


async def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    api_port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0", "--fsync", "never",
                                  "--secret-file", str(secret_file), "--api-port", str(api_port),
                                  "--api-rate", "1000000", "--api-burst", "1000000")  # a fuzzer is not a flood
    token = mint(SECRET, "api", "schemathesis", time.time() + 600)
    async with peers.Daemon(command, tmp_path / "idled.stderr") as daemon:
        # the document's examples kick "alice": online, so that a kick's 200 is checked too
        alice = await peers.Client.login(daemon.port, "uid", "alice", token=mint(SECRET, "uid", "alice", time.time() + 600))
        document = await trio.to_thread.run_sync(_document, api_port, token)
        json.loads(document)
        (tmp_path / "openapi.json").write_bytes(document)
        (tmp_path / "schemathesis.toml").write_text(CONFIG)
        run = [sys.executable, "-m", "schemathesis.cli", "--config-file", "schemathesis.toml", "run", "openapi.json",
               "--url", f"http://127.0.0.1:{api_port}", "--checks", "all", "--mode", "all",
               "--max-examples", str(MAX_EXAMPLES), "--generation-deterministic", "--generation-codec", "ascii", "--continue-on-failure",
               "--workers", "1", "--request-timeout", "10", "--no-color"]
        env = {"IDLED_TEST_API_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        with trio.fail_after(120):
            result = await trio.run_process(run, cwd=tmp_path, env=env, capture_stdout=True,
                                            stderr=subprocess.STDOUT, check=False)
        await alice.stream.aclose()
    report = result.stdout.decode(errors="replace")
    print(report)  # (pytest -s shows it: the phases, the cases generated)
    assert result.returncode == 0, report
    assert "5 selected / 5 total" in report, report  # every operation of the document was tested
    assert "Examples" in report and "Coverage" in report and "Fuzzing" in report, report
