"""The bytes of one HTTP connection not yet parsed, and where the next request head ends in them (sans-IO).

Theory of operation
-------------------
Both of idled's HTTP listeners read request heads through an ``Inbox``: the HTTP API (``idled.server.api.http``,
which hands h11 nothing more than the head, then exactly the body its Content-Length announces) and the
metrics endpoint (``idled.ops.http``, one request per connection). What a client sends beyond the head -- a
pipelined request, the bytes of a body not read -- waits here. The next head always starts at the inbox's
first byte, so it is checked here before any parser sees it, each byte once however the bytes arrive (one at
a time from a slowloris: ``head()`` resumes where it stopped, no rescanning):

* **CRLF only.** A line of the head ends with CR LF; an LF not preceded by CR (a bare LF, which h11 0.16
  accepts as a line end, as some proxies do and others do not: a way to make two parsers disagree on where
  a header or the head ends) is ``400 bad_request``.
* **No obs-fold.** A header line that begins with a space or a tab continues the line before it in HTTP/1.0's
  grammar (obs-fold, RFC 9112 5.2): h11 joins the two, a proxy may read the second as a header of its own
  (``X-Pad: y`` then `` Transfer-Encoding: chunked``: framed by chunks there, by Content-Length here) --
  the same disagreement as a bare LF. RFC 9112 5.2 lets a server refuse it: ``400 bad_request``.
* **The head limit, to the byte.** ``limit`` bytes of request line, headers and the empty line are accepted,
  one more is ``431 headers_too_large`` -- however the bytes arrive (h11's own limit counts only what it
  holds of an incomplete head, so a head that arrived whole in one read passed at any size). While the head
  is incomplete the connection reads at most ``room()`` more: a connection that has shown no token holds at
  most ``limit`` bytes here.

A first byte that cannot begin a request line (a control character or space: a TLS ClientHello, a stray
empty line) is ``400`` at once, as h11 would say, rather than after the head limit or the timeout.

Worked example, limit 64: ``b"GET / HTTP/1.1\\r\\nHost: x\\r"`` (24 bytes) arrives: an LF at 15, after a CR:
the request line ends; no other LF; 24 bytes scanned, room 40. ``b"\\n\\r\\n"`` arrives: the LF at 24 follows
the CR at 23 and ends the line begun at 16 (not empty); the LF at 26 follows a CR and ends the line begun at
25 -- an empty line: the head is bytes 0..26, taken out; what followed it stays, for the body or the next
request.
"""

from __future__ import annotations

__all__ = ["HeadError", "Inbox"]

CR, LF = 0x0D, 0x0A
FOLD = (0x20, 0x09)  # SP, HTAB: a line beginning with one is obs-fold
FIRST_REQUEST_BYTE = 0x21  # a request line begins with a method: a visible character


class HeadError(Exception):
    """A request head broke a rule: ``status`` (400, 431), ``code`` (``bad_request``, ``headers_too_large``) and
    ``message`` for the client."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Inbox:
    """Received bytes of one connection (``data``), the next request head found in them (see above)."""

    __slots__ = ("data", "limit", "_scanned", "_line")

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit
        self._scanned = 0  # bytes of the next head looked at already
        self._line = 0  # where the head's current line begins

    def room(self) -> int:
        """Bytes to read at most while the head is incomplete (``head()`` returned None: at least one)."""
        return max(1, self.limit - len(self.data))

    def head(self) -> bytes | None:
        """The next request head, taken out of the inbox (from its first byte to its empty line's LF), or None
        while it is incomplete. ``HeadError``: a bare LF (400), obs-fold (400), a first byte no request begins
        with (400), a head beyond ``limit`` (431)."""
        data = self.data
        if not data:
            return None
        if data[0] < FIRST_REQUEST_BYTE:
            raise HeadError(400, "bad_request", "not an HTTP request line")
        pos, end = self._scanned, min(len(data), self.limit)
        while True:
            if self._line < end and data[self._line] in FOLD:  # (the current line's first byte is in: line > 0)
                raise HeadError(400, "bad_request", "a header line begins with a space or tab (obs-fold, RFC 9112 5.2)")
            lf = data.find(b"\n", pos, end)
            if lf < 0:
                break
            if data[lf - 1] != CR:  # (lf > 0: the first byte is not an LF)
                raise HeadError(400, "bad_request", "a bare LF in the request head: its lines must end with CR LF")
            if lf - 1 == self._line:  # an empty line: the head ends with it
                self._scanned = self._line = 0
                return self.take(lf + 1)
            pos = self._line = lf + 1
        self._scanned = end
        if len(data) >= self.limit:  # no empty line in the first `limit` bytes: the head is longer
            raise HeadError(431, "headers_too_large", f"the request head is larger than {self.limit} bytes")
        return None

    def take(self, count: int) -> bytes:
        """The first ``count`` bytes (fewer if there are not as many), out of the inbox."""
        piece = bytes(self.data[:count])
        del self.data[:count]  # (CPython moves the bytearray's start: no copy of the rest)
        return piece
