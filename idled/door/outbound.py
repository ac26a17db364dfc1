"""How a process reaches another core: its links, over TLS when configured, and which failures are configuration.

Theory of operation
-------------------
A *link* is a connection one idled process opens to another core: a standby's to its active
(``idled.server.ha.follow``), an elected follower's to its leader (the same code, run by ``idled.server.node``),
an edge's to its core (``idled.server.edge.link``) and each gateway or observer connection the edge relays
(``idled.server.edge.users``). What the door is for listeners, this module is for links: one place that
opens them, so no link kind can forget TLS.

**The policy** (``LinkPolicy.of(config)``, once per process): with ``link_tls``, every link to a TCP address
speaks TLS (a ``unix:PATH`` core -- the core's internal socket behind ``--workers`` -- stays plain: it is on
this machine, mode 0600). The core's certificate is verified against ``link_ca`` (else the system's trust
store) and must name ``link_server_name`` (else the host of the address dialled: a name, or an IP for a core
reached by IP); TLS 1.2 minimum, ALPN ``idled/1`` (``idled.door.tls.client_context``). With ``link_cert`` the
link presents that certificate; a relayed connection never does (``relay=True``): it carries someone else's
login, which must not borrow the edge's identity. A file that does not load is one ``Fatal`` line at start.

**Authentication.** The link logs in as it always has: with a token minted from the shared secret (when the
process has one), now inside TLS, so it cannot be read or replayed off the wire; the core's certificate,
verified, authenticates the core to the link. A client certificate (``link_cert``) is an addition: it is what
a core with ``tls_client_ca`` checks when a login carries no token (a process with no secret), see
docs/tls.md for why tokens are the default.

**Dialling** (``dial``): TCP, then the TLS handshake. The first bytes the core answers are kept (at most
``HEARD_BYTES``), so that a failed handshake can say what answered: an idled core in plain text reads a TLS
hello as a frame far over its limit and answers a plain ``too_large`` error frame.

**Failures** are of two kinds, because what the process does next depends on it (``LinkFailed.fix``):

* *transient* (``fix`` None): nothing listens yet, the connection was reset or closed during the handshake,
  the core answered ``busy`` or ``server_shutdown``. A later attempt may succeed: the link retries, always
  -- an active that is down when its standby starts is waited for, as before.
* *a mismatch* (``fix`` says what to change): the two sides cannot speak, and no retry will cure it:
  a plaintext link to a core that serves TLS (its ``tls_required`` frame: ``LinkFailed.tls_required``), a TLS
  link to a core that does not (``not_tls``), a certificate that does not verify or does not name the
  address, our certificate refused by the core, no protocol version or cipher in common. While
  ``policy.strict`` -- nothing has worked since the process started: no link has logged in, the process has
  not led -- a mismatch is fatal: the process exits with one line naming the link, the address and what to
  change (``policy.fatal``, exit status 2). Once something has worked, a mismatch that appears later (the
  other side was reconfigured) is logged once and retried, never fatal: a running standby or edge keeps
  its state and catches up when the configurations agree again.

**Several cores** (an edge's ``--core A,B``: an active and its standbys, or an elected group). A mismatch
with one of them says nothing about the others -- during a failover one may serve an expired certificate,
or still be plaintext while the rest moved to TLS -- so it is not fatal by itself: the link logs it (once
per core and failure, ``LinkRound.tell``) and tries the next core at once. The process ends only when
every core answered a mismatch in one full round of attempts (``LinkRound.over``), with one line naming
them all (``policy.fatal_round``); a core that could not be reached, refused ``busy`` or named another as
leader answered no mismatch, and the link keeps trying, as with one core that is not up yet. One core is
a round of one: the rule above, unchanged. The standby and an elected follower dial one address each.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import trio

from idled.door.tls import TLSConfigError, Wrapped, client_context, untie
from idled.ops.config import Config
from idled.ops.fatal import EXIT_USAGE, Fatal
from idled.protocol import NEED_DATA, Error, ErrorCode, FrameDecoder, ProtocolError, parse_server_message

__all__ = ["HEARD_BYTES", "LinkFailed", "LinkPolicy", "LinkRound", "LinkTLS", "broken_link", "close_link", "dial"]

HEARD_BYTES: Final = 512  # what the core answered a TLS hello with, kept to say what it was
CLOSE_TIMEOUT: Final = 1.0  # seconds a TLS close_notify may take before the socket is closed regardless
# Error frames a plaintext idled core answers a TLS hello with: it read the hello as an oversized frame.
_PLAIN_CORE: Final = frozenset({ErrorCode.TOO_LARGE, ErrorCode.BAD_FRAME, ErrorCode.BAD_MESSAGE})
# OpenSSL's words for "what answered is not TLS".
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "HTTP_REQUEST",
                             "UNKNOWN_PROTOCOL", "RECORD_TOO_LARGE"})
# ... for "no version, cipher or application protocol in common".
_NO_COMMON: Final = ("PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "NO_SHARED_CIPHER",
                     "HANDSHAKE_FAILURE", "NO_APPLICATION_PROTOCOL", "INSUFFICIENT_SECURITY")
# X509 verification codes that mean the certificate names another host / is out of its validity.
_NAME_CODES: Final = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_DATE_CODES: Final = frozenset({9, 10})  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED

FIX_NOT_TLS: Final = "remove link_tls, or give that core tls_cert and tls_key"


class LinkFailed(Exception):
    """A link could not be opened or was refused: ``reason`` says what happened (stable words, no timings: it
    is logged once per change); ``fix`` what to change, or None if a later attempt may succeed."""

    def __init__(self, reason: str, fix: str | None = None) -> None:
        super().__init__(reason if fix is None else f"{reason}: {fix}")
        self.reason, self.fix = reason, fix

    @property
    def mismatch(self) -> bool:
        return self.fix is not None

    @classmethod
    def tls_required(cls) -> LinkFailed:
        """A plaintext link's login answered ``tls_required``: the core serves TLS on that port."""
        return cls("it serves TLS on that port (it answered tls_required)",
                   "give link_tls (--link-tls), and link_ca the CA of its certificate unless the system trusts it")


@dataclass(frozen=True, slots=True)
class LinkTLS:
    """The client side of TLS on links: ``context`` (with the link's certificate, if any), ``relay_context``
    (without it: a relayed connection is someone else's), ``server_name`` (None: the host dialled)."""

    context: ssl.SSLContext
    relay_context: ssl.SSLContext
    server_name: str | None


class LinkPolicy:
    """How this process's links reach other cores: ``tls`` (None: plaintext) and ``strict`` (a mismatch is
    fatal: nothing has worked since the start; see the module docstring)."""

    __slots__ = ("tls", "strict")

    def __init__(self, tls: LinkTLS | None = None, *, strict: bool = True) -> None:
        self.tls = tls
        self.strict = strict

    @classmethod
    def of(cls, config: Config) -> LinkPolicy:
        """The policy the configuration asks for; ``Fatal`` (exit 2) naming a file that does not load."""
        if not config.link_tls:
            return cls()
        try:
            context = client_context(config.link_ca, config.link_cert, config.link_key)
            relay = client_context(config.link_ca) if config.link_cert else context
        except TLSConfigError as exc:
            raise Fatal("cannot start link TLS", exc.what, exc.reason, EXIT_USAGE) from None
        return cls(LinkTLS(context, relay, config.link_server_name))

    def proven(self) -> None:
        """Something worked (a link logged in, or the process led): later mismatches are not fatal."""
        self.strict = False

    def fatal(self, link: str, address: str, failure: LinkFailed) -> Fatal:
        """The one line a mismatch at start ends the process with: the link, the address, what to change."""
        return Fatal(link, address, str(failure), EXIT_USAGE)

    def fatal_round(self, link: str, failures: Mapping[str, LinkFailed]) -> Fatal:
        """The one line for a link whose every core answered a mismatch (``failures``: core -> its mismatch, in
        the order tried): every core, and each distinct failure once -- prefixed with its cores unless it is
        every core's. A single core: exactly ``fatal``'s line."""
        if len(failures) == 1:
            ((address, failure),) = failures.items()
            return self.fatal(link, f"to the core at {address}", failure)
        groups: dict[str, list[str]] = {}
        for address, failure in failures.items():
            groups.setdefault(str(failure), []).append(address)
        if len(groups) == 1:
            reason = next(iter(groups))
        else:
            reason = "; ".join(f"{', '.join(cores)}: {text}" for text, cores in groups.items())
        return Fatal(link, f"to the cores at {', '.join(failures)}", reason, EXIT_USAGE)


class LinkRound:
    """A link to several cores: what each core answered in the current round of attempts (its mismatch, or
    None: anything else) and the mismatches already logged (see *Several cores* in the module docstring).
    Sans-IO: the link reports, this says."""

    __slots__ = ("outcomes", "_told")

    def __init__(self) -> None:
        self.outcomes: dict[str, LinkFailed | None] = {}  # this round's failed attempts, in order
        self._told: dict[str, str] = {}  # core -> the mismatch last logged for it

    def failed(self, core: str, failure: LinkFailed | None) -> None:
        """An attempt at ``core`` failed: with ``failure``, a mismatch; None, anything else."""
        self.outcomes[core] = failure

    def over(self) -> dict[str, LinkFailed]:
        """The round ended: every core's mismatch if that is all the round heard (else empty); a new round begins."""
        outcomes, self.outcomes = self.outcomes, {}
        if not outcomes or None in outcomes.values():
            return {}
        return {core: failure for core, failure in outcomes.items() if failure is not None}

    def tell(self, core: str, failure: LinkFailed) -> bool:
        """Whether to log ``failure`` of ``core``: the first time, or when it changed."""
        if self._told.get(core) == str(failure):
            return False
        self._told[core] = str(failure)
        return True

    def connected(self) -> None:
        """A link logged in: a new round, and a later mismatch is news again."""
        self.outcomes.clear()
        self._told.clear()


class _Heard(Wrapped):
    """The transport under a link's TLS, keeping the first bytes the core sent (see *Dialling*)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        super().__init__(stream)
        self.head = b""

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.stream.receive_some(max_bytes)
        if len(self.head) < HEARD_BYTES:
            self.head += bytes(data[: HEARD_BYTES - len(self.head)])
        return data


async def dial(host: str, port: int, policy: LinkPolicy | None, *, relay: bool = False) -> trio.abc.Stream:
    """A connection to the core at ``host:port``: TCP, then (the policy says so) TLS, handshake done. An
    OSError if TCP fails (nothing listens: transient); ``LinkFailed`` if the handshake does. The caller
    bounds it in time."""
    tcp = await trio.open_tcp_stream(host, port)
    tls = policy.tls if policy is not None else None
    if tls is None:
        return tcp
    heard = _Heard(tcp)
    stream = trio.SSLStream(heard, tls.relay_context if relay else tls.context,
                            server_hostname=tls.server_name or host)
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        raise _handshake_failure(exc.__cause__, heard.head, host, tls.server_name) from None
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    finally:
        untie(stream)  # no reference cycle left for the collector (idled.door.tls.untie)
    return stream


def _handshake_failure(cause: BaseException | None, head: bytes, host: str, server_name: str | None) -> LinkFailed:
    if isinstance(cause, ssl.SSLCertVerificationError):
        return _untrusted(cause, server_name or host)
    answer = _idled_answer(head)
    if answer is not None:
        if answer.code in _PLAIN_CORE:
            return LinkFailed(f"it does not speak TLS on that port (it answered the TLS hello in plain text: "
                              f"{answer.code})", FIX_NOT_TLS)
        return LinkFailed(f"it refused the connection: {answer.code}: {answer.reason}")  # busy, shutting down
    reason = getattr(cause, "reason", None) or ""
    if isinstance(cause, ssl.SSLError) and reason in _NOT_TLS and head:
        return LinkFailed(f"what answers there does not speak TLS ({reason})", FIX_NOT_TLS)
    refused = _refused_certificate(cause)
    if refused is not None:
        return refused
    if isinstance(cause, ssl.SSLError) and any(words in reason for words in _NO_COMMON):
        return LinkFailed(f"no TLS version, cipher or protocol in common ({reason})",
                          "idled links speak TLS 1.2 or 1.3 with ECDHE and AEAD suites, ALPN idled/1: check what "
                          "terminates TLS at that address")
    what = reason or (type(cause).__name__ if cause is not None else "closed")
    return LinkFailed(f"TLS handshake failed ({what})")  # reset, closed: a later attempt may succeed


def _untrusted(cause: ssl.SSLCertVerificationError, name: str) -> LinkFailed:
    words = (cause.verify_message or cause.reason or str(cause)).rstrip(".")
    if cause.verify_code in _NAME_CODES:
        return LinkFailed(f"its certificate does not name {name} ({words})",
                          "give link_server_name a name the certificate carries, or certify that core for "
                          f"{name} (subjectAltName)")
    if cause.verify_code in _DATE_CODES:
        return LinkFailed(f"its certificate does not verify ({words})", "renew that core's certificate (tls_cert)")
    return LinkFailed(f"its certificate does not verify ({words})",
                      "give link_ca the CA file that signed that core's certificate")


def _refused_certificate(cause: BaseException | None) -> LinkFailed | None:
    """The core's alert about the certificate we presented (or did not), if that is what ``cause`` is."""
    reason = getattr(cause, "reason", None) or ""
    if not isinstance(cause, ssl.SSLError) or "ALERT" not in reason:
        return None
    if "UNKNOWN_CA" in reason or "CERTIFICATE" in reason:
        return LinkFailed(f"it refused our certificate ({reason})",
                          "give link_cert a certificate its tls_client_ca trusts, or remove link_cert")
    return None


def _idled_answer(head: bytes) -> Error | None:
    """The error frame an idled core answered with in plain text, if ``head`` is one."""
    decoder = FrameDecoder(HEARD_BYTES, parse=parse_server_message)
    decoder.receive_data(head)
    try:
        message = decoder.next_event()
    except ProtocolError:
        return None
    return message if message is not NEED_DATA and type(message) is Error else None


def broken_link(exc: BaseException) -> LinkFailed | None:
    """A mismatch behind a link that broke after its handshake (TLS 1.3: the core judges our certificate
    after the client's handshake ends, so its refusal arrives at the first read), else None."""
    if isinstance(exc, trio.BrokenResourceError):
        return _refused_certificate(exc.__cause__)
    return None


async def close_link(stream: trio.abc.Stream) -> None:
    """Close a link, even while cancelled: a TLS close_notify first, bounded in time (a core that does not
    read cannot hold it), the socket closed regardless."""
    with trio.move_on_after(CLOSE_TIMEOUT) as scope:
        scope.shield = True
        try:
            await stream.aclose()
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)
