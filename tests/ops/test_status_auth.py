"""The metrics port with auth on: health and metrics for anyone, user ids, events and paths for the API token.

Against a real `Server` on real loopback sockets (tests.peers.running), auth on (a secret file): without a
token ``/status/live`` is refused (401) and ``/status`` is a redacted document; with the HTTP API's bearer
token (role ``api``) both are whole; a bad, expired or login-role token is refused; ``/healthz``, ``/readyz``
and ``/metrics`` stay open, and ``/readyz``'s reason keeps paths out of an unauthenticated answer. With auth
off everything is open, as before.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.ops.redact import ALLOWED
from idled.protocol.tokens import API_ROLE, mint
from tests import peers
from tests.peers import running

SECRET = b"metrics-port-secret-0123456789"
ALICE = "alice-7f3c"  # a uid that must never show up in an unauthenticated answer

Response = tuple[int, dict[str, str], str]


def get(port: int, path: str, token: str | None = None, authorization: str | None = None) -> Response:
    """(status, headers with lower-case names, body) of one GET to 127.0.0.1:port (no proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if authorization is not None:
        headers["Authorization"] = authorization
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()


def raw(port: int, request: bytes) -> bytes:
    """The whole answer to ``request`` sent as it is."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def aget(port: int, path: str, token: str | None = None, authorization: str | None = None) -> Response:
    return await trio.to_thread.run_sync(get, port, path, token, authorization)


def api_token(secret: bytes = SECRET, ttl: float = 60.0) -> str:
    return mint(secret, API_ROLE, "ops", time.time() + ttl)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    os.chmod(path, 0o600)
    return path


def user_token(uid: str) -> str:
    return mint(SECRET, "uid", uid, time.time() + 60)


async def test_status_live_needs_the_api_token_with_auth_on(tmp_path: Path, secret_file: Path) -> None:
    """The attacker's view: with auth on, the live status (the last events, with uids) is not for anyone
    who can reach the metrics port."""
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=str(secret_file), settle=False) as h:
        alice = await h.user(ALICE, keepalive=10, token=user_token(ALICE))
        status, headers, body = await aget(port, "/status/live")
        assert status == 401, body
        assert ALICE not in body and str(tmp_path) not in body
        assert headers["www-authenticate"] == 'Bearer realm="idled"'
        assert headers["content-type"] == "application/json" and headers["cache-control"] == "no-store"
        assert json.loads(body)["error"]["code"] == "unauthorized"
        status, _, body = await aget(port, "/status/live", api_token())
        assert status == 200, body
        assert [e["uid"] for e in json.loads(body)["vitals"]["recent_events"]] == [ALICE]
        await alice.stream.aclose()


async def test_bad_expired_and_login_role_tokens_are_refused(tmp_path: Path, secret_file: Path) -> None:
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=str(secret_file), settle=False) as h:
        alice = await h.user(ALICE, keepalive=10, token=user_token(ALICE))
        refused = {
            "another secret": api_token(b"another-secret-0123456789abcdef"),
            "expired": mint(SECRET, API_ROLE, "ops", time.time() - 1),
            "a login token": user_token(ALICE),
            "garbage": "not-a-token",
        }
        for why, token in refused.items():
            for path in ("/status/live", "/status"):
                status, headers, body = await aget(port, path, token)
                assert status == 401, (why, path, body)
                assert ALICE not in body and str(tmp_path) not in body, (why, path)
                assert headers["www-authenticate"] == 'Bearer realm="idled"'
        message = json.loads((await aget(port, "/status", refused["expired"]))[2])["error"]["message"]
        assert "expired" in message
        for scheme in ("Basic " + api_token(), api_token(), "Bearer"):  # not "Bearer <token>"
            assert (await aget(port, "/status/live", authorization=scheme))[0] == 401, scheme
        assert (await aget(port, "/status/live", authorization="bearer " + api_token()))[0] == 200  # case-insensitive
        # Two Authorization headers, a good one among them: refused, not one of them picked.
        twice = (f"GET /status/live HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_token()}\r\n"
                 "Authorization: Bearer nope\r\n\r\n").encode()
        answer = await trio.to_thread.run_sync(raw, port, twice)
        assert answer.startswith(b"HTTP/1.1 401 ") and ALICE.encode() not in answer, answer
        assert b"more than one Authorization header" in answer
        await alice.stream.aclose()


async def test_status_without_a_token_is_redacted_and_with_one_is_whole(tmp_path: Path, secret_file: Path) -> None:
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=str(secret_file), settle=False) as h:
        alice = await h.user(ALICE, keepalive=10, token=user_token(ALICE))
        status, headers, body = await aget(port, "/status")
        assert status == 200 and headers["content-type"] == "application/json"
        # On the raw text: no uid, no path (the data directory, the secret file's, anything under tmp_path).
        assert ALICE not in body and str(tmp_path) not in body and "secret" not in body, body
        assert '"/' not in body, body  # no string that starts like an absolute path
        document = json.loads(body)
        assert document["redacted"] is True
        assert document["ready"] is True and document["ready_reason"] == "ready"
        assert document["sessions_online"] == 1 and document["users_online"] == 1
        assert document["connections"]["user"] == 1 and document["next_seq"] == 2
        assert document["config"]["auth"] is True and document["role"] == "active"
        assert "data_dir" not in document and "vitals" not in document
        status, _, body = await aget(port, "/status", api_token())
        whole = json.loads(body)
        assert status == 200 and whole["redacted"] is False and whole["data_dir"] == str(h.data_dir)
        assert set(document) - {"redacted", "uptime_seconds"} <= set(whole)
        # A field added to /status is left out of the redacted one until someone decides (idled.ops.redact):
        # this fails to make that decision someone's, with the field named.
        assert set(whole) - set(ALLOWED) == {"data_dir", "gateway_watermark_lag", "redacted"}
        await alice.stream.aclose()


async def test_health_and_metrics_stay_open_and_readyz_keeps_paths_out(tmp_path: Path, secret_file: Path) -> None:
    """Probes and Prometheus carry no token: /healthz, /readyz and /metrics answer without one. When the log's
    directory goes away, /readyz says why without naming the path, unless the token is shown."""
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=str(secret_file), settle=False) as h:
        assert (await aget(port, "/healthz"))[:3:2] == (200, "ok\n")
        assert (await aget(port, "/readyz"))[:3:2] == (200, "ready\n")
        status, _, body = await aget(port, "/metrics")
        assert status == 200 and "idled_sessions_online" in body
        moved = h.data_dir.with_name("moved-away")
        os.rename(h.data_dir, moved)  # the probe file can no longer be created where the log is
        try:
            with trio.fail_after(10):
                while (answer := await aget(port, "/readyz"))[0] == 200:  # cached for up to a second
                    await trio.sleep(0.2)
            status, _, reason = answer
            assert status == 503 and "not writable" in reason and "No such file or directory" in reason, reason
            assert str(tmp_path) not in reason and "/" not in reason, reason
            document = json.loads((await aget(port, "/status"))[2])
            assert document["ready"] is False and "not writable" in document["ready_reason"]
            assert str(tmp_path) not in json.dumps(document)
            whole = (await aget(port, "/readyz", api_token()))[2]
            assert str(h.data_dir) in whole, whole  # the operator with the token gets the path
        finally:
            os.rename(moved, h.data_dir)


async def test_with_auth_off_everything_is_open(tmp_path: Path) -> None:
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, settle=False) as h:
        alice = await h.user(ALICE, keepalive=10)
        status, _, body = await aget(port, "/status/live")
        assert status == 200 and ALICE in body
        document = json.loads((await aget(port, "/status"))[2])
        assert document["data_dir"] == str(h.data_dir) and document["redacted"] is False
        await alice.stream.aclose()


@pytest.mark.slow
def test_a_standby_and_its_active_redact_the_same_way(tmp_path: Path, secret_file: Path) -> None:
    """The standby core serves the same endpoint (idled.server.standby): with auth on, neither it nor its
    active names the other (the standby's link, the active's list of standbys) or a path without the token."""
    from tests.server.ha.standby_support import active, standby, wait_for

    flags = ("--secret-file", str(secret_file))
    act_metrics = peers.free_port()
    with active(tmp_path / "a", "--metrics-port", str(act_metrics), *flags) as act:
        sb, sb_metrics = standby(tmp_path / "s", act, *flags)
        with sb:
            def whole(port: int) -> dict[str, Any]:
                return dict(json.loads(get(port, "/status", api_token())[2]))

            wait_for(lambda: whole(sb_metrics)["standby"]["state"] == "streaming", what="the standby streaming")
            assert whole(act_metrics)["replication"]["standbys"][0]["name"].startswith("standby-")
            for port, role in ((sb_metrics, "standby"), (act_metrics, "active")):
                status, _, body = get(port, "/status")
                assert status == 200 and str(tmp_path) not in body and "standby-" not in body, body
                assert f":{act.port}" not in body, body  # the standby's link does not say where the active is
                document = json.loads(body)
                assert document["redacted"] is True and document["role"] == role
                assert get(port, "/status/live")[0] == 401
            assert json.loads(get(sb_metrics, "/status")[2])["standby"]["state"] == "streaming"
            standbys = json.loads(get(act_metrics, "/status")[2])["replication"]["standbys"]
            assert [sorted(entry) for entry in standbys] == [["acked", "sent", "sync"]]  # counted, not named
