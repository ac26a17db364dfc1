"""``GET /v1/events`` (Server-Sent Events) against a real daemon (``idled serve --api-port``), read by a
plain socket client (``tests/server/api/sse.py``: h11 for the HTTP framing, a few lines for the SSE one).

A login's online and an expiry's offline arrive with ``id`` = seq; a follower that reconnects with
``Last-Event-ID`` misses nothing and gets nothing twice; ``uid`` parameters filter; no token is 401;
heartbeats come while nothing happens; a stalled reader is cut (``event: end``, ``busy``) while another reads
on, and resumes without a gap; SIGTERM ends every stream with ``server_shutdown`` and the daemon exits.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from idled.protocol import BYE, Attach, Detach
from idled.protocol.tokens import mint
from tests import peers
from tests.server.api.sse import SseClient

pytestmark = pytest.mark.slow

SECRET = b"e" * 32


def token(role: str, name: str) -> str:
    return mint(SECRET, role, name, time.time() + 600)


def daemon(tmp_path: Path, *options: str) -> tuple[peers.Daemon, int]:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    api_port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0", "--fsync", "never", "--tick", "0.05",
                                  "--secret-file", str(secret_file), "--api-port", str(api_port), *options)
    return peers.Daemon(command, tmp_path / "idled.stderr"), api_port


async def user(port: int, uid: str, keepalive: float | None = None) -> peers.Client:
    return await peers.Client.login(port, "uid", uid, keepalive=keepalive, token=token("uid", uid))


async def test_online_offline_resume_watchlist_auth_heartbeat(tmp_path: Path) -> None:
    proc, api = daemon(tmp_path, "--api-heartbeat", "0.3")
    async with proc as d:
        refused = await SseClient.open(api)
        assert refused.status == 401 and b"unauthorized" in refused.body, (refused.status, refused.body)
        api_token = token("api", "ops")
        full = await SseClient.open(api, token=api_token)
        assert full.status == 200 and full.headers["content-type"].startswith("text/event-stream")
        watch = await SseClient.open(api, "/v1/events?uid=bob", token=api_token)
        resumed = await SseClient.open(api, token=api_token)
        durable = await SseClient.open(api, "/v1/events?durable=true", token=api_token)
        head = await SseClient.open(api, token=api_token, method="HEAD")
        assert head.status == 200 and head.headers["content-type"].startswith("text/event-stream")
        assert head.body == b""

        alice = await user(d.port, "alice", keepalive=1)  # silent: offline (idle) after 1.5 s
        online, offline = await full.events(2)
        assert (online["event"], online["data"]["uid"], offline["event"], offline["data"]["reason"]) == \
            ("online", "alice", "offline", "idle"), (online, offline)
        assert [int(e["id"]) for e in (online, offline)] == [e["data"]["seq"] for e in (online, offline)]
        assert int(offline["id"]) == int(online["id"]) + 1
        first = (await resumed.events(1))[0]
        assert first["id"] == online["id"]
        await resumed.aclose()  # it reconnects later, from the last id it saw
        await alice.stream.aclose()

        for uid in ("bob", "carol", "bob"):  # six events while `resumed` is away
            peer = await user(d.port, uid)
            await peer.send(BYE)
            assert await peer.recv() is None
        later = await full.events(6)
        seqs = [int(e["id"]) for e in [online, offline, *later]]
        assert seqs == list(range(seqs[0], seqs[0] + 8))  # one by one, ids = seqs

        again = await SseClient.open(api, "/v1/events?from=1", token=api_token, last_event_id=first["id"])
        got = await again.events(7)  # the header wins over ?from= (a reconnection repeats its URL)
        assert [int(e["id"]) for e in got] == seqs[1:], "a gap or a duplicate after Last-Event-ID"
        assert [e["data"] for e in got] == [e["data"] for e in [offline, *later]]

        assert [e["id"] for e in await durable.events(8)] == [str(seq) for seq in seqs]  # once written
        old = await SseClient.open(api, "/v1/events?from=" + str(seqs[-2]), token=api_token)
        assert [e["id"] for e in await old.events(2)] == [str(seq) for seq in seqs[-2:]]

        bobs = await watch.events(4)
        assert [e["data"]["uid"] for e in bobs] == ["bob"] * 4
        assert [e["event"] for e in bobs] == ["online", "offline", "online", "offline"]

        with trio.fail_after(5):  # nothing happens now: heartbeats (comments), no event
            assert await full.block() == [": heartbeat"]

        for target in ("/v1/events?from=x", "/v1/events?nope=1", f"/v1/events?from={seqs[-1] + 100}"):
            bad = await SseClient.open(api, target, token=api_token)
            assert bad.status == 400, (target, bad.body)
        assert (await SseClient.open(api, token=api_token, last_event_id="-1")).status == 400


async def test_stalled_reader_is_cut_others_read_on_and_it_resumes(tmp_path: Path) -> None:
    proc, api = daemon(tmp_path)
    async with proc as d:
        api_token = token("api", "ops")
        stalled = await SseClient.open(api, token=api_token, rcvbuf=4096)
        reader = await SseClient.open(api, token=api_token)
        gw = await peers.Client.login(d.port, "gateway", "gw", token=token("gateway", "gw"))
        sessions = 8000  # 16,000 events (~3 MB of SSE): more than the stalled socket's buffers hold
        for start in range(0, sessions, 2000):
            keys = tuple(f"u{i}" for i in range(start, start + 2000))
            await gw.send(Attach(keys, keepalive=600))
            await gw.send(Detach(keys))
        got = await reader.events(2 * sessions, timeout=30)  # the other follower: every event, in time
        first = int(got[0]["id"])
        assert [int(e["id"]) for e in got] == list(range(first, first + 2 * sessions))

        with trio.fail_after(15):  # OBSERVER_STALL (5 s) without a byte taken: cut (the daemon says so)
            while "event stream took nothing" not in d.stderr():
                await trio.sleep(0.02)
        # It reads now (within SEND_ERROR_TIMEOUT): the write in flight ends whole, then the end event.
        seen: list[int] = []
        ending = None
        with trio.fail_after(20):
            while (event := await stalled.event()) is not None:
                if event.get("event") == "end":
                    ending = event
                    break
                seen.append(int(event["id"]))
        assert ending is not None and ending["data"]["code"] == "busy", ending
        assert "id" not in ending
        assert seen and seen == list(range(first, first + len(seen))) and len(seen) < 2 * sessions
        assert await stalled.block() is None  # closed after it

        back = await SseClient.open(api, token=api_token, last_event_id=str(seen[-1]))
        rest = await back.events(2 * sessions - len(seen), timeout=30)
        assert [int(e["id"]) for e in rest] == list(range(seen[-1] + 1, first + 2 * sessions))
        stats = await SseClient.open(api, "/v1/stats", token=api_token)  # the API answers beside the streams
        assert stats.status == 200
        await gw.stream.aclose()


async def test_streams_count_in_api_max_clients_and_sigterm_ends_them(tmp_path: Path) -> None:
    proc, api = daemon(tmp_path, "--api-max-clients", "3")
    async with proc as d:
        api_token = token("api", "ops")
        streams = [await SseClient.open(api, token=api_token) for _ in range(3)]
        busy = await SseClient.open(api, token=api_token)  # a fourth connection: the limit
        assert busy.status == 503 and b"unavailable" in busy.body, (busy.status, busy.body)
        alice = await user(d.port, "alice")
        for stream in streams:
            assert (await stream.events(1))[0]["data"]["uid"] == "alice"
        started = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        for stream in streams:
            with trio.fail_after(10):
                ending = await stream.event()
                while ending is not None and ending["event"] != "end":
                    ending = await stream.event()
            assert ending is not None and ending["data"]["code"] == "server_shutdown", ending
            assert await stream.block() is None
        assert await d.wait(20) == 0
        assert time.monotonic() - started < 10
        await alice.stream.aclose()


async def test_a_login_is_sent_once_per_follower(tmp_path: Path) -> None:
    """Many followers at once, each sees the same events once (the shared hub and texts)."""
    proc, api = daemon(tmp_path)
    async with proc as d:
        api_token = token("api", "ops")
        followers = [await SseClient.open(api, token=api_token) for _ in range(20)]
        for uid in ("a", "b"):
            peer = await user(d.port, uid)
            await peer.send(BYE)
            assert await peer.recv() is None
        views = [[(e["id"], e["event"], e["data"]["uid"]) for e in await f.events(4)] for f in followers]
        assert all(view == views[0] for view in views)
        assert [v[1:] for v in views[0]] == [("online", "a"), ("offline", "a"), ("online", "b"), ("offline", "b")]
