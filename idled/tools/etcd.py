"""A real etcd for the election tests and ``idled bench --failover``: one member on 127.0.0.1, free client and
peer ports, a data directory of the caller's, killed at the end. Debian's ``etcd-server`` package provides
the binary (``.ci/system-deps`` installs it); without it the tests that need it are skipped, saying so, and
the benchmark refuses to start."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from idled.tools.loadtest.target import free_port

ETCD = shutil.which("etcd")
START_TIMEOUT = 15.0


class EtcdServer:
    """One running etcd member. ``url(prefix)``: the ``--election`` URL for it."""

    def __init__(self, directory: Path) -> None:
        assert ETCD is not None
        self.client_port, peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "etcd.log"
        command = [
            ETCD, "--name", "test", "--data-dir", str(directory / "data"),
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}", "--initial-cluster-state", "new",
            # a one-member cluster elects itself after one election timeout: keep it short
            "--heartbeat-interval", "50", "--election-timeout", "500",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as response:
                    if json.load(response).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd not healthy within {START_TIMEOUT} s: {self.log_tail()}")

    def url(self, prefix: str) -> str:
        return f"etcd://127.0.0.1:{self.client_port}/{prefix}"

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
