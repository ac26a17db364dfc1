"""Redirects, handled on purpose: a 307 or 308 to the same origin is followed with the same POST, body and
signature; a 301/302/303, another origin or too many hops is a failed attempt whose error says why, retried
and in the end dead-lettered with that reason. The rule as a pure function, then with real parts: an
`idled serve`, `idled hook` and a receiver on 127.0.0.1 answering with real redirects."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from idled.hook.post import MAX_REDIRECTS, redirect_target
from tests import peers
from tests.hook.helpers import WHSEC, Hook, gateway_events, hook_command, until
from tests.hook.receiver import Receiver

ORIGIN = httpx.URL("http://127.0.0.1:8080/hook")


@pytest.mark.parametrize("status, location, target", [
    (307, "/moved", "http://127.0.0.1:8080/moved"),
    (308, "http://127.0.0.1:8080/v2?x=1", "http://127.0.0.1:8080/v2?x=1"),
    (307, "next", "http://127.0.0.1:8080/next"),
])
def test_a_307_or_308_to_the_same_origin_is_followed(status: int, location: str, target: str) -> None:
    assert redirect_target(ORIGIN, ORIGIN, status, location) == (httpx.URL(target), "")


@pytest.mark.parametrize("status, location, why", [
    (301, "/moved", "only 307 and 308 keep the POST"),
    (302, "/moved", "only 307 and 308 keep the POST"),
    (303, "/moved", "only 307 and 308 keep the POST"),
    (307, "http://127.0.0.2:8080/hook", "another origin"),
    (307, "http://127.0.0.1:8081/hook", "another origin"),
    (308, "https://127.0.0.1:8080/hook", "another origin"),
    (307, None, "without a Location"),
    (307, "http://[::1/", "unreadable Location"),
    # A host that is punycode but not valid IDNA: httpx's URL.host decodes it and raises idna's error (a
    # ValueError, not InvalidURL); it must be a refused hop, not an exception that ends `idled hook`.
    (307, "http://xn--hooks-example.com/hook", "another origin"),
    (308, "http://xn--ls8h.example/hook", "another origin"),
])
def test_anything_else_is_refused_with_the_reason(status: int, location: str | None, why: str) -> None:
    target, reason = redirect_target(ORIGIN, ORIGIN, status, location)
    assert target is None and why in reason


@pytest.mark.slow
async def test_real_redirects_followed_refused_and_dead_lettered_with_the_reason(tmp_path: Path) -> None:
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--fsync", "always", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    other = f"http://127.0.0.2:{port}/hook"  # another origin (loopback all the same): never asked
    script = ["307:/moved", "308:/moved-again", "ok",  # batch 1: two hops, delivered on its first attempt
              "302:/elsewhere", f"307:{other}",  # batch 2: two refused redirects, dead-lettered (--max-attempts 2)
              *["307:/loop"] * (MAX_REDIRECTS + 1), "ok"]  # batch 3: too many hops, then delivered
    with Receiver(script) as receiver:
        async with peers.Daemon(command, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", "--batch-wait", "0.5",
                                     "--max-attempts", "2", "--backoff-base", "0.05"), tmp_path / "hook.stderr")
            try:
                def done(uid: str) -> bool:
                    if uid == "two":
                        return (state / "dead-letter.jsonl").exists()
                    return bool(receiver.acked) and receiver.acked[-1].json()["events"][-1]["uid"] == uid

                for uid in ("one", "two", "three"):
                    await gateway_events(port, [uid], f"gw-{uid}")  # online + offline: one batch
                    await until(lambda: done(uid), 20, f"batch {uid}")  # noqa: B023 -- awaited in this iteration
            finally:
                hook.kill()
    paths = [request.path for request in receiver.attempts]
    assert paths[:3] == ["/hook", "/moved", "/moved-again"]
    assert paths[3:5] == ["/hook", "/hook"]  # refused redirects: each attempt starts at --url again
    assert paths[5:] == ["/hook", *["/loop"] * MAX_REDIRECTS, "/hook"]
    webhook = Webhook(WHSEC)
    first = receiver.attempts[:3]
    assert len({(r.body, r.headers["webhook-id"], r.headers["webhook-signature"]) for r in first}) == 1
    assert [r.headers["Idled-Attempt"] for r in first] == ["1"] * 3  # the hops are one attempt
    for request in receiver.attempts:
        webhook.verify(request.body, request.headers)
    (line,) = (state / "dead-letter.jsonl").read_text().splitlines()
    letter = json.loads(line)
    assert [e["uid"] for e in letter["batch"]["events"]] == ["two", "two"] and letter["attempts"] == 2
    assert letter["error"] == f"HTTP 307 Temporary Redirect: redirect to {other} not followed: another origin " \
                              "than --url's (fix --url)"
    log = hook.stderr()
    assert "HTTP 302 Found: redirect to http://127.0.0.1" in log and "only 307 and 308 keep the POST" in log
    assert f"more than {MAX_REDIRECTS} redirects" in log
    assert log.count("moved permanently") == 1 and "update --url" in log
    assert [e["uid"] for e in receiver.acked_events()] == ["one", "one", "three", "three"]


@pytest.mark.slow
async def test_a_location_httpx_cannot_read_is_a_failed_attempt_not_the_end_of_the_hook(tmp_path: Path) -> None:
    # A receiver (or whatever answers at --url) sends a 307 whose Location's host is punycode that is not valid
    # IDNA: httpx computes the next request even with follow_redirects off and raises idna's ValueError.
    state, secret_file = tmp_path / "state", tmp_path / "hook-secret"
    secret_file.write_text(WHSEC)
    port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    with Receiver(["307:http://xn--hooks-example.com/hook"] * 2) as receiver:
        async with peers.Daemon(command, tmp_path / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", "--batch-wait", "0.2",
                                     "--max-attempts", "2", "--backoff-base", "0.05"), tmp_path / "hook.stderr")
            try:
                await gateway_events(port, ["u1"], "gw")
                await until(lambda: (state / "dead-letter.jsonl").exists() or hook.proc.poll() is not None, 20,
                            "a dead letter or the hook's exit")
                assert hook.proc.poll() is None, hook.stderr()[-2000:]
            finally:
                hook.kill()
    (line,) = (state / "dead-letter.jsonl").read_text().splitlines()
    letter = json.loads(line)
    assert letter["attempts"] == 2 and letter["error"].startswith("an answer that could not be read (")
    assert len(receiver.attempts) == 2
