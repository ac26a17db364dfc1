"""`idled loadtest --peer mqtt`, small: idled and a Mosquitto of its own under the same load, one after the other,
and both rows printed. Real processes: `idled serve`, Debian's mosquitto, the load test's workers.

300 connections, keepalive 2 s (both timeouts 3 s), 1 % silenced at recorded moments and 1 % saying bye (an
MQTT DISCONNECT): each peer must close or report offline every silent session -- never before its timeout, idled within its bound (2 ticks), the broker
within timeout + grace (7 s: Mosquitto 2.0 sweeps its clients every 5 s, in whole seconds) -- and no pinger.
Nothing here asserts a CPU, memory or lateness figure, which a shared CI machine cannot promise (docs/peer.md
has the measured ones). Then the broker on its own: the codec's bytes against it, and a broker that will not
start.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from idled.tools.loadtest import mqtt
from idled.tools.loadtest.mosquitto import config_text, find_mosquitto, spawn_mosquitto
from idled.tools.loadtest.target import stop_server
from idled.tools.loadtest.wire import mqtt_client_id

pytestmark = pytest.mark.slow

CONNECTIONS = 300


def test_idled_and_mosquitto_side_by_side(tmp_path: Path) -> None:
    _mosquitto()
    out = tmp_path / "peer.json"
    proc = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "loadtest", "--peer", "mqtt", "--quiet", "--json", str(out),
         "--connections", str(CONNECTIONS), "--ramp", "3000", "--keepalive", "2", "--peer-grace", "7", "--bye-fraction", "0.01",
         "--duration", "14", "--ask-one-in", "3"],  # two keepalives in three quiet (idled's msg, MQTT's PUBLISH)
        capture_output=True, text=True, timeout=90, cwd=tmp_path)
    print(proc.stdout)
    print(proc.stderr[-3000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # both rows and the ratios, printed
    assert "peer comparison: 300 connections, keepalive 2 s (one keepalive in 3 a ping" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("idled serve --workers 0", "mosquitto 2."))]
    assert len(rows) == 2, proc.stdout
    assert any(line.startswith("idled / mosquitto") for line in proc.stdout.splitlines())
    document = json.loads(out.read_text())
    assert [run["wire"] for run in document["runs"]] == ["idled", "mqtt"]
    for row, run in zip(document["rows"], document["runs"]):
        v = run["verdict"]
        assert (row["false"], row["missed"], row["early"]) == (0, 0, 0), (row["name"], v)
        assert run["aborted"] is None and run["ok"], row["name"]
        assert run["connections"]["logged_in"] == CONNECTIONS, run["errors"]
        assert v["planned"]["silent"] == 3 and v["unjudged_silent"] == 0 and v["generator_late"] == 0
        assert row["timed"] == 3  # every silent session timed
        assert v["logouts_seen"] == v["planned"]["bye"] == 3  # a DISCONNECT (a bye) closes at once
        assert run["steady"] is not None and run["steady"]["events_per_s"] > 0  # a steady window was measured


# ------------------------------------------------------------------------------- the broker, on its own


def _mosquitto() -> str:
    binary = find_mosquitto()
    if binary is None:
        pytest.skip("mosquitto is not installed (Debian: apt-get install mosquitto; see .ci/system-deps)")
    return binary


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def test_the_codec_speaks_to_a_real_broker_of_our_own() -> None:
    """CONNECT -> CONNACK 0, PINGREQ -> PINGRESP, DISCONNECT -> the broker closes: the bytes of `mqtt`, against
    the Mosquitto `spawn_mosquitto` starts (its own configuration, on loopback, a free port)."""
    binary = _mosquitto()
    async with trio.open_nursery() as nursery:
        server = await spawn_mosquitto(nursery, binary)
        try:
            assert server.host == "127.0.0.1" and server.process is not None

            def session() -> tuple[bytes, bytes, bytes]:
                with socket.create_connection((server.host, server.port), timeout=5) as sock:
                    sock.sendall(mqtt.connect(mqtt_client_id(7), 20))
                    hello = _read_exactly(sock, 4)
                    sock.sendall(mqtt.PINGREQ)
                    pong = _read_exactly(sock, 2)
                    sock.sendall(mqtt.DISCONNECT)
                    return hello, pong, sock.recv(16)

            hello, pong, after = await trio.to_thread.run_sync(session)
            assert mqtt.parse_packet(hello) == mqtt.Connack(False, 0)
            assert pong == mqtt.PINGRESP and after == b""  # EOF: the broker closed on DISCONNECT
        finally:
            await stop_server(server, grace=5.0)
            nursery.cancel_scope.cancel()
    assert server.returncode == 0  # SIGTERM: a clean exit


async def test_a_broker_that_does_not_start_is_one_line_naming_it(tmp_path: Path) -> None:
    fake = tmp_path / "mosquitto"
    fake.write_text("#!/bin/sh\necho 'Error: Unable to open config file' >&2\nexit 3\n")
    fake.chmod(0o755)
    async with trio.open_nursery() as nursery:
        with pytest.raises(RuntimeError, match=r"mosquitto did not listen on 127\.0\.0\.1:\d+ \(exit status 3\): "
                                               r"Error: Unable to open config file"):
            await spawn_mosquitto(nursery, str(fake))
        nursery.cancel_scope.cancel()


def test_the_configuration_is_its_own_and_on_loopback() -> None:
    text = config_text(18830, "/tmp/x/mosquitto.log", "idled")
    lines = text.splitlines()
    assert "listener 18830 127.0.0.1" in lines and "allow_anonymous true" in lines
    assert "persistence false" in lines and "max_keepalive 65535" in lines
    assert "log_dest file /tmp/x/mosquitto.log" in lines and "user idled" in lines
    assert "/etc/mosquitto" not in text and "include_dir" not in text
