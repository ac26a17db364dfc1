"""The status page (``/`` on the metrics port, idled.ops.statuspage): its routes over plain HTTP, then the page
itself in a real headless Chromium against a real `idled serve`.

The browser tests skip (with the reason) where chromium, chromedriver or selenium are missing or Chromium does
not start; ``.ci/system-deps`` installs them, so in CI and on the developers' machines they run. Each saves a
screenshot under ``$IDLED_TEST_ARTIFACTS`` (default: ``test-artifacts/`` in the checkout, git-ignored) and
prints its path.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from idled.ops.statuspage import CSP, live_query
from idled.protocol import Login, encode
from idled.protocol.tokens import API_ROLE, mint
from idled.tools.bench.daemon import Daemon
from tests import peers
from tests.browser import headless_chromium, until
from tests.peers import running, start_metrics

ROOT = Path(__file__).resolve().parents[2]
Response = tuple[int, dict[str, str], bytes]


def get(port: int, path: str, method: str = "GET") -> Response:
    """(status, headers with lower-case names, body) of one request to 127.0.0.1:port (no proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


async def aget(port: int, path: str, method: str = "GET") -> Response:
    return await trio.to_thread.run_sync(get, port, path, method)


# -- plain HTTP: the routes, their headers, the JSON ------------------------------------------------------------


def test_live_query_reads_after_and_since() -> None:
    assert live_query("") == (0, None)
    assert live_query("after=42&since=1790000000.5") == (42, 1790000000.5)
    for bad in ("after=-1", "after=x", "since=nan", "since=inf"):
        with pytest.raises(ValueError):
            live_query(bad)


async def test_the_page_its_files_and_headers(tmp_path: Path) -> None:
    metrics_port = peers.free_port()
    async with running(tmp_path, metrics_port=metrics_port):
        status, headers, body = await aget(metrics_port, "/")
        assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
        assert headers["content-security-policy"] == CSP and "default-src 'self'" in CSP
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-cache"
        assert headers["x-frame-options"] == "DENY"
        html = body.decode()
        assert 'src="static/status.js"' in html and 'href="static/status.css"' in html
        assert "<script>" not in html and "style=" not in html  # nothing inline: the CSP would refuse it
        for path, kind in (("/static/status.js", "text/javascript"), ("/static/status.css", "text/css"),
                           ("/static/favicon.svg", "image/svg+xml")):
            status, headers, body = await aget(metrics_port, path)
            assert status == 200 and headers["content-type"].startswith(kind) and body, path
            assert headers["content-security-policy"] == CSP and headers["x-content-type-options"] == "nosniff"
        status, headers, body = await aget(metrics_port, "/", "HEAD")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 1000
        for path in ("/static/", "/static/nope.js", "/index.html", "/status/live/x", "/static/../status.html"):
            status, headers, _ = await aget(metrics_port, path)
            assert status == 404 and headers["x-content-type-options"] == "nosniff", path
        for method in ("POST", "PUT", "DELETE"):  # read-only
            assert (await aget(metrics_port, "/", method))[0] == 405
            assert (await aget(metrics_port, "/status/live", method))[0] == 405


async def test_status_live_sends_only_what_changed(tmp_path: Path) -> None:
    metrics_port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=metrics_port, settle=False) as h:
        alice = await h.user("alice", keepalive=10)
        status, headers, body = await aget(metrics_port, "/status/live")
        assert status == 200 and headers["content-type"] == "application/json"
        assert headers["cache-control"] == "no-store" and headers["x-content-type-options"] == "nosniff"
        first = json.loads(body)
        assert first["sessions_online"] == 1 and first["version"] and first["ready"] is True
        assert first["config"]["tick"] == 0.1 and first["config"]["fsync"] == "never" and "secret_file" not in first["config"]
        assert "workers" not in first  # one process
        vitals = first["vitals"]
        assert [(e["uid"], e["kind"]) for e in vitals["recent_events"]] == [("alice", "online")]
        assert vitals["recent_limit"] == 100 and set(vitals["rates"]) == {"events_per_second_1m", "events_per_second_10s"}
        assert vitals["lateness"]["count"] == 0 and vitals["lateness"]["buckets"]
        with trio.fail_after(10):
            while not h.server.vitals.samples:
                await trio.sleep(0.05)
        seq = vitals["recent_events"][-1]["seq"]
        newest = h.server.vitals.samples[-1].wall
        later = json.loads((await aget(metrics_port, f"/status/live?after={seq}&since={newest}"))[2])["vitals"]
        assert later["recent_events"] == [] and all(s["t"] > newest for s in later["history"])
        bob = await h.user("bob", keepalive=10)
        later = json.loads((await aget(metrics_port, f"/status/live?after={seq}"))[2])["vitals"]
        assert [e["uid"] for e in later["recent_events"]] == ["bob"]
        assert (await aget(metrics_port, "/status/live?after=nope"))[0] == 400
        document = json.loads((await aget(metrics_port, "/status"))[2])
        assert "vitals" not in document and document["lateness"]["p99"] is None and "config" in document
        await alice.stream.aclose()
        await bob.stream.aclose()


async def test_without_health_the_page_is_a_note_pointing_to_the_core() -> None:
    """An edge's metrics endpoint (no Health): / says the page is the core's; the JSON routes do not exist."""
    async with trio.open_nursery() as nursery:
        port = await start_metrics(nursery, CollectorRegistry())
        status, headers, body = await aget(port, "/")
        assert status == 200 and b"core's" in body and headers["content-security-policy"] == CSP
        assert (await aget(port, "/static/status.css"))[0] == 200
        assert (await aget(port, "/status/live"))[0] == 404 and (await aget(port, "/status"))[0] == 404
        assert (await aget(port, "/metrics"))[0] == 200
        nursery.cancel_scope.cancel()


# -- in a real headless Chromium ---------------------------------------------------------------------------------


class Serve(Daemon):
    """`idled serve` in a subprocess (`idled.tools.bench.daemon`) with a metrics port (loopback, auth off there)."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.metrics_port = peers.free_port()
        super().__init__(tmp_path, "--metrics-port", str(self.metrics_port), "--tick", "0.1", "--fsync", "never", *extra)

    def login(self, uid: str, keepalive: float, token: str | None = None) -> socket.socket:
        """A user logged in (welcome read); it sends nothing more, so it goes idle after 1.5 x keepalive."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.sendall(encode(Login("uid", uid, token, keepalive)))
        reply = sock.recv(4096)
        assert b"welcome" in reply, reply
        return sock


REBOUND = "evil.example"  # a name Chromium resolves to 127.0.0.1, as a rebinding DNS server's second answer does


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile"),
                           (f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",)) as driver:
        yield driver


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser, its console emptied; left on a blank page (a page left polling a stopped daemon
    would log failed requests into the next test)."""
    chromium.get_log("browser")
    try:
        yield chromium
    finally:
        chromium.get("about:blank")


def screenshot(driver: Any, name: str) -> Path:
    """The whole page as ``name`` under $IDLED_TEST_ARTIFACTS (default test-artifacts/ in the checkout)."""
    directory = Path(os.environ.get("IDLED_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    directory.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, height + 140)  # the window's frame around the viewport, in headless Chromium too
    time.sleep(1.2)  # a poll at the new size: charts are drawn to their width
    path = directory / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def problems(driver: Any) -> list[str]:
    """Console errors (SEVERE: script errors, CSP refusals, failed loads) and requests that did not answer 200."""
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    failed = driver.execute_script(
        "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
        ".filter(e => e.responseStatus !== 200).map(e => e.name + ' ' + e.responseStatus)")
    return severe + failed


def cells(driver: Any, selector: str) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(n => n.textContent)", selector)


@pytest.mark.slow
def test_the_page_in_chromium_shows_logins_live_and_the_lateness_histogram(browser: Any, tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    users: list[socket.socket] = []
    try:
        browser.get(f"http://127.0.0.1:{serve.metrics_port}/")
        until(lambda: browser.find_element("id", "link").text == "live", 10, "the page's first poll")
        assert browser.title == "idled status"
        uid = "page-alice"
        users.append(serve.login(uid, keepalive=1))  # silent: idle after 1.5 s
        logged_in = time.monotonic()
        until(lambda: browser.find_elements("css selector", f"#events tr[data-uid='{uid}'][data-kind='online']"), 2.0,
              "the login on the page")
        print(f"login shown after {time.monotonic() - logged_in:.2f} s")
        users.append(serve.login("page-bob", keepalive=60))  # stays online
        until(lambda: browser.find_elements("css selector", f"#events tr[data-uid='{uid}'][data-kind='offline']"), 10,
              "the idle offline on the page")
        bars = until(lambda: [c for c in browser.execute_script(
            "return Array.from(document.querySelectorAll('#chart-lateness rect.bar')).map(r => +r.dataset.count)")
            if c > 0], 5, "a lateness bar")
        assert bars == [1]
        assert browser.find_element("id", "p99").text not in ("", "–")
        assert browser.find_element("id", "lateness-count").text == "1"
        assert browser.find_elements("css selector", "#chart-sessions polyline.sessions")
        until(lambda: browser.find_element("id", "sessions").text == "1", 3, "one session online")
        assert browser.find_element("id", "ready").text == "ready"
        assert "tick" in cells(browser, "#config dt") and "100 ms" in cells(browser, "#config dd")
        assert browser.find_element("id", "workers-none").is_displayed()
        time.sleep(1.5)  # a few more polls: history and rate charts with several points
        assert problems(browser) == []
        screenshot(browser, "status-page.png")
    finally:
        for user in users:
            user.close()
        serve.stop()


@pytest.mark.slow
def test_the_page_of_a_core_with_workers_shows_them(browser: Any, tmp_path: Path) -> None:
    serve = Serve(tmp_path, "--workers", "2")
    users: list[socket.socket] = []
    try:
        browser.get(f"http://127.0.0.1:{serve.metrics_port}/")
        until(lambda: browser.find_element("id", "link").text == "live", 10, "the page's first poll")
        users.append(serve.login("worker-user", keepalive=60))
        until(lambda: browser.find_elements("css selector", "#events tr[data-uid='worker-user']"), 2.0, "the login")
        until(lambda: len(browser.find_elements("css selector", "#workers tr")) == 2, 5, "two workers")
        assert cells(browser, "#workers td:first-child") == ["worker-0", "worker-1"]
        assert cells(browser, "#workers td.state-up") == ["up", "up"]
        until(lambda: sorted(cells(browser, "#workers td:nth-child(5)")) == ["0", "1"], 5, "the user's session")
        assert problems(browser) == []
        screenshot(browser, "status-page-workers.png")
    finally:
        for user in users:
            user.close()
        serve.stop()


@pytest.mark.slow
def test_the_pages_of_an_active_and_its_standby_say_their_roles_leader_lag_and_the_limit_in_force(
        browser: Any, tmp_path: Path) -> None:
    """Before, a standby's page never drew (its /status/live has no vitals: the script threw on every poll) and
    neither page said role, leader or replication; the configuration said ``max connections 10,000,000`` where
    the daemon refuses at its descriptor budget."""
    (tmp_path / "active").mkdir()
    (tmp_path / "standby").mkdir()
    active = Serve(tmp_path / "active", "--max-connections", "10000000")
    standby = Serve(tmp_path / "standby", "--standby-of", f"127.0.0.1:{active.port}")
    users: list[socket.socket] = []
    try:
        users.append(active.login("page-carol", keepalive=60))
        browser.get(f"http://127.0.0.1:{standby.metrics_port}/")
        until(lambda: browser.find_element("id", "link").text == "live", 10, "the standby page's first poll")
        assert browser.find_element("id", "role").text == f"standby of 127.0.0.1:{active.port}"
        rows = dict(zip(cells(browser, "#cluster dt"), cells(browser, "#cluster dd"), strict=True))
        assert rows["leader"] == f"127.0.0.1:{active.port}", rows
        until(lambda: "1 records behind" not in browser.find_element("id", "cluster").text
              and "last seq 1, 0 records behind (0 s)" in browser.find_element("id", "cluster").text, 10, "caught up")
        assert rows["replication"].startswith(f"streaming from 127.0.0.1:{active.port}: "), rows
        assert problems(browser) == []
        screenshot(browser, "status-page-standby.png")

        browser.get(f"http://127.0.0.1:{active.metrics_port}/")
        until(lambda: browser.find_element("id", "link").text == "live", 10, "the active page's first poll")
        assert browser.find_element("id", "role").text == "active"
        until(lambda: "standby-" in browser.find_element("id", "cluster").text, 10, "the standby in the active's page")
        config = dict(zip(cells(browser, "#config dt"), cells(browser, "#config dd"), strict=True))
        limit = config["max connections"]
        assert limit.endswith(" connections)") and "(10,000,000 configured; capped: open-file limit " in limit, limit
        assert int(limit.split(" ")[0].replace(",", "")) < 10_000_000
        assert problems(browser) == []
    finally:
        for user in users:
            user.close()
        standby.stop()
        active.stop()


FETCH = """
const [url, options, done] = arguments;
fetch(url, options).then(r => r.text().then(t => done([r.status, t])), e => done([0, String(e)]));
"""


def presence_of(api_port: int, uid: str) -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{api_port}/v1/presence?uid={uid}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return bool(json.loads(response.read())["users"][0]["online"])


@pytest.mark.slow
def test_a_page_of_another_site_can_neither_read_the_status_nor_kick(browser: Any, tmp_path: Path) -> None:
    """The attacker's page in a real browser, auth off (the default). Its name, rebound to 127.0.0.1, puts it on
    the metrics port's origin: before, its script read ``/status/live`` (alice, her events) as its own; now 421.
    And its script POSTs a kick to the API as a ``no-cors`` ``text/plain`` request, which needs no preflight:
    before, alice was kicked; now refused (its Origin, its media type), alice stays. The real page keeps
    working at ``localhost`` (an SSH tunnel's address)."""
    api_port = peers.free_port()
    serve = Serve(tmp_path, "--api-port", str(api_port))
    users: list[socket.socket] = []
    try:
        users.append(serve.login("alice", keepalive=60))
        browser.get(f"http://{REBOUND}:{serve.metrics_port}/nothing")  # any page of that origin will do
        status, text = browser.execute_async_script(FETCH, "/status/live", {})
        assert status == 421 and "alice" not in text, (status, text[:300])
        kick = {"method": "POST", "mode": "no-cors", "headers": {"Content-Type": "text/plain;charset=UTF-8"},
                "body": '{"uid":"alice"}'}
        status, text = browser.execute_async_script(FETCH, f"http://127.0.0.1:{api_port}/v1/kick", kick)
        assert status == 0  # opaque: the page learns nothing of the answer, which is not the point
        time.sleep(0.3)
        assert presence_of(api_port, "alice"), "a page of another site kicked alice"
        browser.get_log("browser")  # (the refusals above, logged by the console)
        browser.get(f"http://localhost:{serve.metrics_port}/")
        until(lambda: browser.find_elements("css selector", "#events tr[data-uid='alice'][data-kind='online']"), 10,
              "alice's login on the page at localhost")
        assert problems(browser) == []
    finally:
        for user in users:
            user.close()
        serve.stop()


def displayed(driver: Any, element_id: str) -> bool:
    return bool(driver.find_element("id", element_id).is_displayed())


def enter_token(driver: Any, token: str) -> None:
    field = driver.find_element("id", "token")
    field.clear()
    field.send_keys(token)
    driver.find_element("css selector", "#auth-form button[type=submit]").click()


def stored(driver: Any) -> tuple[str | None, int]:
    """(the token in sessionStorage, how many items localStorage holds)."""
    return tuple(driver.execute_script(
        "return [sessionStorage.getItem('idled.apiToken'), localStorage.length]"))  # type: ignore[return-value]


@pytest.mark.slow
def test_with_auth_on_the_page_asks_for_the_api_token_and_says_when_it_is_refused(browser: Any, tmp_path: Path) -> None:
    """Auth on: the page shows how the daemon is (the redacted /status) and asks for the HTTP API's token; a
    refused token is said so and forgotten; a good one shows the live page, kept in sessionStorage only."""
    secret = b"status-page-secret-0123456789"
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(secret)
    os.chmod(secret_file, 0o600)
    serve = Serve(tmp_path, "--secret-file", str(secret_file))
    uid = "page-carol"
    users: list[socket.socket] = []
    try:
        users.append(serve.login(uid, keepalive=60, token=mint(secret, "uid", uid, time.time() + 60)))
        page = f"http://127.0.0.1:{serve.metrics_port}/"
        browser.get(page)
        until(lambda: displayed(browser, "auth"), 10, "the token form")
        assert browser.find_element("id", "link").text == "token needed"
        until(lambda: browser.find_element("id", "sessions").text == "1", 5, "the redacted status's figures")
        assert browser.find_element("id", "ready").text == "ready" and "tick" in cells(browser, "#config dt")
        assert uid not in browser.page_source and not browser.find_elements("css selector", "#events tr")
        assert browser.find_element("id", "events-none").text == "The last events need an API token."
        screenshot(browser, "status-page-token-needed.png")

        refused = {"token expired": mint(secret, API_ROLE, "ops", time.time() - 5),
                   "token is a login token, not an api token": mint(secret, "uid", uid, time.time() + 60),
                   "token signature does not match": mint(b"another-secret-0123456789ab", API_ROLE, "ops", time.time() + 60)}
        for reason, token in refused.items():
            enter_token(browser, token)
            until(lambda reason=reason: reason in browser.find_element("id", "auth-error").text, 5, f"the refusal ({reason})")
            assert browser.find_element("id", "auth-error").text.startswith("The token was refused: ")
            assert displayed(browser, "auth") and stored(browser) == (None, 0)  # a refused token is not kept
            time.sleep(1.2)  # the next poll (no token) keeps the message up
            assert reason in browser.find_element("id", "auth-error").text
        assert uid not in browser.page_source

        token = mint(secret, API_ROLE, "ops", time.time() + 600)
        enter_token(browser, token)
        until(lambda: browser.find_element("id", "link").text == "live", 5, "the live page")
        until(lambda: browser.find_elements("css selector", f"#events tr[data-uid='{uid}']"), 5, "the user's login")
        assert not displayed(browser, "auth") and displayed(browser, "forget")
        assert stored(browser) == (token, 0) and token not in browser.current_url
        requested = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert requested and not [name for name in requested if token in name]  # in a header, never in a URL
        screenshot(browser, "status-page-with-token.png")

        browser.refresh()  # the same tab keeps it (sessionStorage), without asking again
        until(lambda: browser.find_elements("css selector", f"#events tr[data-uid='{uid}']"), 10, "live after a reload")
        assert not displayed(browser, "auth")

        browser.find_element("id", "forget").click()
        until(lambda: displayed(browser, "auth"), 5, "the form after forgetting")
        assert stored(browser) == (None, 0) and not browser.find_elements("css selector", "#events tr")
        assert uid not in browser.page_source
        unexpected = [p for p in problems(browser) if not ("status/live" in p and "401" in p)]
        assert unexpected == []
    finally:
        for user in users:
            user.close()
        serve.stop()
