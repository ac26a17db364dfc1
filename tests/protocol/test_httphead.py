"""The inbox's head finding, fed bytes (pure): CRLF only, no obs-fold, the limit to the byte, however the bytes
arrive."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idled.protocol.httphead import HeadError, Inbox

HEAD = b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\r\n"


def feed(inbox: Inbox, parts: list[bytes]) -> list[bytes]:
    """Add ``parts`` one by one, taking every head found after each (as the connection does)."""
    heads = []
    for part in parts:
        inbox.data += part
        while (head := inbox.head()) is not None:
            heads.append(head)
    return heads


def error(inbox: Inbox, parts: list[bytes]) -> str:
    with pytest.raises(HeadError) as info:
        feed(inbox, parts)
    return info.value.code


def test_a_head_byte_by_byte_and_what_follows_it_stays() -> None:
    inbox = Inbox(1024)
    parts = [bytes([b]) for b in HEAD + b"body"]
    assert feed(inbox, parts) == [HEAD]
    assert inbox.data == b"body" and inbox.take(2) == b"bo" and inbox.data == b"dy"


def test_pipelined_heads_in_one_read() -> None:
    inbox = Inbox(1024)
    assert feed(inbox, [HEAD * 3 + HEAD[:10]]) == [HEAD] * 3
    assert feed(inbox, [HEAD[10:]]) == [HEAD]
    assert inbox.data == b""


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\nHost: x\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\n",
    b"GET / HTTP/1.1\r\nHost: x\nY: z\r\n\r\n"])
def test_a_bare_lf_anywhere_in_the_head(bad: bytes) -> None:
    assert error(Inbox(1024), [bad]) == "bad_request"
    assert error(Inbox(1024), [bytes([b]) for b in bad]) == "bad_request"


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: y\r\n Transfer-Encoding: chunked\r\nContent-Length: 14\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: y\r\n\tz\r\n\r\n", b"GET / HTTP/1.1\r\n Host: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n \r\n\r\n"])
def test_obs_fold_a_line_that_begins_with_a_space_or_tab(bad: bytes) -> None:
    # RFC 9112 5.2: a server may refuse obs-fold with 400; h11 joins the line to the one before it (a header
    # a proxy in front may have read as a header of its own, or not at all: two parsers, two requests)
    assert error(Inbox(1024), [bad]) == "bad_request"
    assert error(Inbox(1024), [bytes([b]) for b in bad]) == "bad_request"
    at = bad.index(b"\r\n ") if b"\r\n " in bad else bad.index(b"\r\n\t")
    assert error(Inbox(1024), [bad[:at + 2], bad[at + 2:]]) == "bad_request"  # the fold begins a read
    assert feed(Inbox(1024), [b"GET / HTTP/1.1\r\nX: a b\t c \r\n\r\n"]) != []  # spaces inside a line are fine


def test_a_first_byte_no_request_begins_with() -> None:
    for first in (b"\x16\x03\x01", b"\r\n", b"\n", b" GET"):
        assert error(Inbox(1024), [first]) == "bad_request"


def test_the_limit_to_the_byte() -> None:
    base = b"GET / HTTP/1.1\r\nX: "
    for limit in (len(HEAD), 64, 1000):
        exact = base + b"a" * (limit - len(base) - 4) + b"\r\n\r\n"
        assert len(exact) == limit
        assert feed(Inbox(limit), [exact]) == [exact]
        assert feed(Inbox(limit), [bytes([b]) for b in exact]) == [exact]
        over = base + b"a" * (limit - len(base) - 3) + b"\r\n\r\n"
        assert error(Inbox(limit), [over]) == "headers_too_large"
        assert error(Inbox(limit), [bytes([b]) for b in over]) == "headers_too_large"


def test_room_keeps_an_incomplete_head_within_the_limit() -> None:
    inbox = Inbox(100)
    assert inbox.room() == 100
    inbox.data += b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 50
    assert inbox.head() is None and inbox.room() == 100 - len(inbox.data)
    inbox.data += b"a" * inbox.room()
    with pytest.raises(HeadError):
        inbox.head()


def _line(raw: bytes) -> bytes:
    """A head line: no CR or LF in it, and not beginning with a space or tab (that would be obs-fold)."""
    line = raw.replace(b"\r", b"r").replace(b"\n", b"n")
    return b"x" + line[1:] if line[0] in b" \t" else line


lines = st.lists(st.binary(min_size=1, max_size=40).map(_line), min_size=1, max_size=12)


@given(lines, st.lists(st.integers(min_value=0, max_value=600), max_size=8), st.binary(max_size=50))
def test_any_split_finds_the_same_head(parts: list[bytes], cuts: list[int], rest: bytes) -> None:
    head = b"G" + b"\r\n".join(parts) + b"\r\n\r\n"
    wire = head + rest
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    chunks = [wire[a:b] for a, b in zip(points, points[1:])]
    inbox = Inbox(4096)
    found = []
    for chunk in chunks:
        inbox.data += chunk
        if not found and (got := inbox.head()) is not None:
            found.append(got)
    assert found == [head] and inbox.data == rest


def refused_in_pieces(head: bytes, cuts: list[int]) -> str:
    """The code of the HeadError ``head`` raises when fed cut at ``cuts`` (every piece before it finds no head)."""
    points = sorted({min(c, len(head)) for c in cuts} | {0, len(head)})
    inbox = Inbox(4096)
    with pytest.raises(HeadError) as info:
        for a, b in zip(points, points[1:]):
            inbox.data += head[a:b]
            assert inbox.head() is None
    return info.value.code


@given(lines, st.integers(min_value=0, max_value=11), st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_any_split_finds_a_bare_lf(parts: list[bytes], where: int, cuts: list[int]) -> None:
    where %= len(parts)
    head = b"G" + b"".join(part + (b"\n" if i == where else b"\r\n") for i, part in enumerate(parts)) + b"\r\n"
    assert refused_in_pieces(head, cuts) == "bad_request"


@given(lines, st.integers(min_value=1, max_value=11), st.sampled_from([b" ", b"\t"]),
       st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_any_split_finds_an_obs_fold(parts: list[bytes], where: int, fold: bytes, cuts: list[int]) -> None:
    parts = [*parts, b"y"]
    where = 1 + where % (len(parts) - 1)  # a header line (not the request line) begins with the fold
    parts[where] = fold + parts[where]
    head = b"G" + b"\r\n".join(parts) + b"\r\n\r\n"
    assert refused_in_pieces(head, cuts) == "bad_request"
