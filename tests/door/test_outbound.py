"""How a link's TLS handshake failure is classified (idled.door.outbound): what only a configuration change
cures (fatal at start) against what a later attempt may cure (retried). Real sockets against small trio servers
that answer a TLS hello the way each kind of peer does; real certificates (tests/tlscerts.py)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from idled.door.outbound import FIX_NOT_TLS, LinkFailed, LinkPolicy, LinkRound, dial
from idled.door.tls import server_context
from idled.ops.config import Config
from idled.ops.fatal import Fatal
from idled.protocol import Error, ErrorCode, encode
from tests.tlscerts import Certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


@asynccontextmanager
async def answering(answer: Callable[[trio.SocketStream], Awaitable[None]]) -> AsyncIterator[int]:
    """A loopback server running ``answer`` on each connection; yields its port."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


def policy(certs: Certs, **settings: object) -> LinkPolicy:
    return LinkPolicy.of(Config(link_tls=True, link_ca=str(certs.ca), **settings).validate())  # type: ignore[arg-type]


def plain_answer(frame: bytes) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def answer(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the hello
        await stream.send_all(frame)
        await stream.aclose()
    return answer


async def failure(port: int, links: LinkPolicy) -> LinkFailed:
    with pytest.raises(LinkFailed) as info:
        with trio.fail_after(10):
            await dial("127.0.0.1", port, links)
    return info.value


@pytest.mark.parametrize("code, mismatch", [
    (ErrorCode.TOO_LARGE, True),  # a plaintext idled core read the hello as a frame over its limit
    (ErrorCode.BUSY, False),  # a TLS core at capacity answers before TLS: transient, never fatal at start
    (ErrorCode.SERVER_SHUTDOWN, False),
])
async def test_an_idled_core_answering_in_plain_text(certs: Certs, code: str, mismatch: bool) -> None:
    async with answering(plain_answer(encode(Error(code, "said so")))) as port:
        failed = await failure(port, policy(certs))
    assert failed.mismatch is mismatch, failed
    assert code in failed.reason


async def test_something_else_that_does_not_speak_tls(certs: Certs) -> None:
    async with answering(plain_answer(b"HTTP/1.1 400 Bad Request\r\n\r\n")) as port:
        failed = await failure(port, policy(certs))
    assert failed.mismatch and "does not speak TLS" in failed.reason and "remove link_tls" in str(failed)


async def test_a_core_that_closes_during_the_handshake_is_transient(certs: Certs) -> None:
    async def close(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.aclose()

    async with answering(close) as port:
        failed = await failure(port, policy(certs))
    assert not failed.mismatch, failed


@pytest.mark.parametrize("kind, words", [
    ("self_signed", "give link_ca the CA file that signed"),
    ("expired", "renew that core's certificate"),
])
async def test_a_certificate_that_does_not_verify(tmp_path: Path, certs: Certs, kind: str, words: str) -> None:
    cert, key = getattr(certs, kind)()
    context = server_context(str(cert), str(key))

    async def tls(stream: trio.SocketStream) -> None:
        try:
            await trio.SSLStream(stream, context, server_side=True).do_handshake()
        except trio.BrokenResourceError:
            pass

    async with answering(tls) as port:
        failed = await failure(port, policy(certs))
    assert failed.mismatch and words in str(failed), failed


async def test_a_link_file_that_does_not_load_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(Fatal) as info:
        LinkPolicy.of(Config(link_tls=True, link_ca=str(tmp_path / "missing.pem")).validate())
    assert info.value.status == 2 and "cannot start link TLS (link CA" in str(info.value)


# -- a link to several cores (LinkRound, LinkPolicy.fatal_round): pure ---------------------------------------

PLAIN = LinkFailed("it does not speak TLS on that port", FIX_NOT_TLS)
EXPIRED = LinkFailed("its certificate does not verify (certificate has expired)", "renew that core's certificate")


def test_a_round_ends_the_link_only_if_every_core_answered_a_mismatch() -> None:
    cores = LinkRound()
    cores.failed("a:1", PLAIN)
    cores.failed("b:1", EXPIRED)
    assert cores.over() == {"a:1": PLAIN, "b:1": EXPIRED}
    assert cores.over() == {}  # a new round: nothing heard yet is no verdict
    cores.failed("a:1", PLAIN)
    cores.failed("b:1", None)  # unreachable, busy, not_leader: it may agree once it answers
    assert cores.over() == {}
    cores.failed("a:1", PLAIN)
    cores.connected()  # a welcome meanwhile (a connection that was up ends the round)
    assert cores.over() == {}


def test_a_mismatch_is_told_once_per_core_until_it_changes_or_a_link_logs_in() -> None:
    cores = LinkRound()
    assert cores.tell("a:1", PLAIN) and cores.tell("b:1", PLAIN)
    assert not cores.tell("a:1", PLAIN) and not cores.tell("b:1", PLAIN)
    assert cores.tell("a:1", EXPIRED) and not cores.tell("a:1", EXPIRED)
    cores.connected()
    assert cores.tell("a:1", EXPIRED)


def test_the_fatal_line_of_a_round_names_every_core_and_each_failure_once() -> None:
    links = LinkPolicy()
    alone = links.fatal_round("edge link", {"a:1": PLAIN})
    assert str(alone) == str(links.fatal("edge link", "to the core at a:1", PLAIN))  # one core: as it always was
    same = links.fatal_round("edge link", {"a:1": PLAIN, "b:1": PLAIN, "c:1": PLAIN})
    assert str(same) == f"edge link (to the cores at a:1, b:1, c:1): {PLAIN}"
    mixed = links.fatal_round("edge link", {"a:1": PLAIN, "b:1": EXPIRED, "c:1": PLAIN})
    assert str(mixed) == f"edge link (to the cores at a:1, b:1, c:1): a:1, c:1: {PLAIN}; b:1: {EXPIRED}"
    assert mixed.status == 2 and "\n" not in str(mixed)
