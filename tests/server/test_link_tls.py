"""Links between processes over TLS (issue 33, item 6): a standby's link to a TLS active, the refusals at start of
a configuration the two sides cannot speak, and a mismatch that appears later. Real daemons, real certificates
(tests/tlscerts.py), loopback only. The edge's link is in test_link_tls_edge.py, the elected pair in
test_link_tls_election.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idled.protocol import Attach, Detach, Login, encode, tokens
from idled.tools.bench.daemon import Daemon
from tests.peers import free_port
from tests.server.ha.standby_support import records, status, wait_for
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

SECRET = b"s" * 32


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_bytes(SECRET)
    return path


def tls_flags(certs: Certs) -> list[str]:
    cert, key = certs.server()
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


def serve(directory: Path, *flags: str) -> Daemon:
    directory.mkdir(parents=True, exist_ok=True)
    return Daemon(directory, "--metrics-port", "0", "--fsync", "always", "--log-level", "info", *flags)


class TLSGateway:
    """A gateway over TLS (token from the secret) making events: ``churn(n)`` attaches n uids, detaches half."""

    def __init__(self, port: int, certs: Certs, name: str = "g") -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
        token = tokens.mint(SECRET, "gateway", name, time.time() + 600)
        self.sock.sendall(encode(Login("gateway", name, token)))
        self.next = 0

    def churn(self, users: int) -> None:
        uids = tuple(f"u{self.next + i}" for i in range(users))
        self.next += users
        self.sock.sendall(encode(Attach(uids, 600.0)) + encode(Detach(uids[: users // 2])))

    def close(self) -> None:
        self.sock.close()


def last_seq(data_dir: Path) -> int:
    return max(records(data_dir), default=0)


def standby_command(directory: Path, active_port: int, metrics_port: int, *flags: str) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--data-dir", str(directory / "data"),
            "--standby-of", f"127.0.0.1:{active_port}", "--metrics-port", str(metrics_port), "--log-level", "info",
            *flags]


def test_standby_replicates_from_a_tls_active_over_link_tls(tmp_path: Path, certs: Certs, secret: Path) -> None:
    """Fails on main: the standby could not speak TLS to the active, and looped "connecting" for ever (the
    settings come from the environment here, which main ignores). The standby starts first, with nothing at
    the active's address (waited for: not fatal), then follows the TLS active over TLS, logged in by a token
    minted from the shared secret."""
    port, metrics = free_port(), free_port()
    auth = ["--secret-file", str(secret)]
    command = standby_command(tmp_path / "s", port, metrics, *auth)
    env = {**os.environ, "IDLED_LINK_TLS": "true", "IDLED_LINK_CA": str(certs.ca)}
    with open(tmp_path / "standby.stderr", "wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_for(lambda: status(metrics)["standby"]["state"] == "connecting", what="the standby's status")
        time.sleep(1.0)  # a few attempts at an address where nothing listens
        assert proc.poll() is None, (tmp_path / "standby.stderr").read_text()
        with serve(tmp_path / "a", "--port", str(port), *auth, *tls_flags(certs)):
            gateway = TLSGateway(port, certs)
            for _ in range(10):
                gateway.churn(10)
            wait_for(lambda: last_seq(tmp_path / "a/data") == 150, what="the active's records")
            wait_for(lambda: status(metrics)["standby"]["last_seq"] >= 150, what="the standby to catch up")
            doc = status(metrics)["standby"]
            assert doc["connected"] and doc["tls"] and doc["state"] == "streaming"
            assert records(tmp_path / "s/data") == records(tmp_path / "a/data")
            gateway.close()
        assert "from seq 1 over TLS" in (tmp_path / "standby.stderr").read_text()
    finally:
        proc.terminate()
        proc.wait(20)


# (the active's flags beyond TLS or not, the standby's link flags, what its one fatal line must say)
REFUSALS = {
    "plaintext link, TLS active": (True, [], "it serves TLS on that port (it answered tls_required): give link_tls"),
    "TLS link, plaintext active": (False, ["--link-tls", "--link-ca", "{ca}"],
                                   "it does not speak TLS on that port (it answered the TLS hello in plain text: "
                                   "too_large): remove link_tls, or give that core tls_cert and tls_key"),
    "a CA that did not sign the active's certificate": (
        True, ["--link-tls", "--link-ca", "{other_ca}"],
        "its certificate does not verify (unable to get local issuer certificate): give link_ca the CA file"),
    "a name the certificate does not carry": (
        True, ["--link-tls", "--link-ca", "{ca}", "--link-server-name", "core.example"],
        "its certificate does not name core.example (Hostname mismatch"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_link_the_active_cannot_speak_is_one_fatal_line_at_start(tmp_path: Path, certs: Certs, case: str) -> None:
    """Fails on main: the standby kept running (its link retried for ever, whatever the active answered)."""
    tls, link_flags, expected = REFUSALS[case]
    other_ca = Certs(tmp_path / "other").ca if "{other_ca}" in link_flags else None
    flags = [flag.format(ca=certs.ca, other_ca=other_ca) for flag in link_flags]
    with serve(tmp_path / "a", *(tls_flags(certs) if tls else [])) as act:
        started = time.monotonic()
        done = subprocess.run(standby_command(tmp_path / "s", act.port, free_port(), *flags),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
    fatal = [line for line in done.stderr.splitlines() if line.startswith("idled: fatal:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(fatal) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert fatal[0].startswith(f"idled: fatal: standby link (to the active at 127.0.0.1:{act.port}): "), fatal
    assert expected in fatal[0], fatal
    assert took < 15, f"{took:.1f} s: the first attempt decides"


def test_a_mismatch_after_the_link_worked_is_logged_once_and_retried(tmp_path: Path, certs: Certs) -> None:
    """The active is restarted on the same port without TLS, then with TLS again: the running standby logs
    the mismatch once, keeps running, and resumes streaming when the configurations agree again."""
    port, metrics = free_port(), free_port()
    with open(tmp_path / "standby.stderr", "wb") as err:
        proc = subprocess.Popen(standby_command(tmp_path / "s", port, metrics, "--link-tls", "--link-ca", str(certs.ca)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        def streaming() -> bool:
            doc = status(metrics)["standby"]
            return bool(doc["state"] == "streaming" and doc["connected"])

        with serve(tmp_path / "a", "--port", str(port), *tls_flags(certs)):
            wait_for(streaming, what="the standby to stream over TLS")
        with serve(tmp_path / "a", "--port", str(port)):  # reconfigured: plaintext
            wait_for(lambda: "does not speak TLS" in str(status(metrics)["standby"]["error"]), what="the mismatch")
            time.sleep(2.0)  # several more attempts (backoff up to 5 s)
            assert proc.poll() is None
        with serve(tmp_path / "a", "--port", str(port), *tls_flags(certs)):
            wait_for(streaming, what="the standby to stream again")
        logged = (tmp_path / "standby.stderr").read_text()
        assert logged.count("does not speak TLS") == 1, logged
        assert "fatal" not in logged
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
