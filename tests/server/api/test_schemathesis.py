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

Two runs (``RUNS``). The API's lengths are the protocol's, in UTF-8 bytes (a uid 1..256, a device 1..64, a
reason 0..256); JSON Schema counts characters, so the document's ``maxLength`` is exact for ASCII and only
necessary beyond it: 37 four-byte characters are a schema-valid device of 148 bytes, and a byte-exact pattern
is no regular expression anyone could read. So every check runs with strings in ASCII
(``--generation-codec ascii``), then with strings anywhere in Unicode with every check but
``positive_data_acceptance`` (which would count that device as a valid request refused): non-ASCII text still
must never earn a 5xx, an undocumented status or body, or be accepted where the document forbids it. The byte
limits of non-ASCII text are tested exactly in tests/server/api/test_request.py.
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
# The token through the document's own security scheme (named "bearer"). And a request refused for its size,
# 413 (api_max_batch, api_max_body) or 431 (the 16 KiB head, which a long GET /v1/presence fills), is refused:
# Schemathesis' defaults count neither as a rejection. Sizes the document cannot say (a head's bytes) are
# documented per operation as these two statuses.
TOO_LARGE = '"413", "431"'
CONFIG = f"""
[auth.openapi.bearer]
bearer = "${{IDLED_TEST_API_TOKEN}}"

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429", "5xx", {TOO_LARGE}]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx", {TOO_LARGE}]
"""


def _document(port: int, token: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/openapi.json",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return bytes(response.read())


# (the codec, the checks left out): every check on ASCII text; then text anywhere in Unicode, with every check
# but the one that counts a schema-valid string of over N bytes in N characters as a refused valid request
RUNS = (("ascii", ()), ("utf-8", ("positive_data_acceptance",)))


async def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    api_port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0", "--fsync", "never",
                                  "--secret-file", str(secret_file), "--api-port", str(api_port),
                                  "--api-rate", "1000000", "--api-burst", "1000000")  # a fuzzer is not a flood
    token = mint(SECRET, "api", "schemathesis", time.time() + 600)
    reports = []
    async with peers.Daemon(command, tmp_path / "idled.stderr") as daemon:
        document = await trio.to_thread.run_sync(_document, api_port, token)
        json.loads(document)
        (tmp_path / "openapi.json").write_bytes(document)
        (tmp_path / "schemathesis.toml").write_text(CONFIG)
        for codec, excluded in RUNS:
            # the document's examples kick "alice": online, so that a kick's 200 is checked too
            alice = await peers.Client.login(daemon.port, "uid", "alice",
                                             token=mint(SECRET, "uid", "alice", time.time() + 600))
            run = [sys.executable, "-m", "schemathesis.cli", "--config-file", "schemathesis.toml", "run",
                   "openapi.json", "--url", f"http://127.0.0.1:{api_port}", "--checks", "all", "--mode", "all",
                   "--max-examples", str(MAX_EXAMPLES), "--generation-deterministic", "--generation-codec", codec,
                   "--continue-on-failure", "--workers", "1", "--request-timeout", "10", "--no-color",
                   # An event stream never ends: each case would wait out the request timeout. Its parameters,
                   # refusals and framing are held to the document by tests/server/api/test_events*.py.
                   "--exclude-path", "/v1/events",
                   *(("--exclude-checks", ",".join(excluded)) if excluded else ())]
            env = {"IDLED_TEST_API_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
            with trio.fail_after(120):
                result = await trio.run_process(run, cwd=tmp_path, env=env, capture_stdout=True,
                                                stderr=subprocess.STDOUT, check=False)
            await alice.stream.aclose()
            reports.append((codec, result.returncode, result.stdout.decode(errors="replace")))
    for codec, _, report in reports:
        print(f"--- strings in {codec}\n{report}")  # (pytest -s shows them: the phases, the cases generated)
    for codec, status, report in reports:
        assert status == 0, f"strings in {codec}:\n{report}"
        # every operation of the document was tested, but the event stream (excluded above)
        assert "5 selected / 6 total" in report and "Tested: 5" in report, report
        assert "Examples" in report and "Coverage" in report and "Fuzzing" in report, report
