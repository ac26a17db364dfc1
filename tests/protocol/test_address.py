"""The one address grammar (idled.protocol.address): every form, every refusal, and round trips for any address."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from idled.protocol.address import (
    MAX_ADDRESS_CHARS, MAX_UNIX_PATH_BYTES, AddressError, Endpoint, HostPort, UnixPath, format_address, format_addresses,
    parse_address, parse_addresses, parse_port,
)

# -- every form -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "default", "address"), [
    ("127.0.0.1:7878", None, ("127.0.0.1", 7878)),
    ("core-1.example.org:1", None, ("core-1.example.org", 1)),
    ("CORE_1:65535", None, ("CORE_1", 65535)),  # '_' as container and service names have it; case kept
    ("localhost:07878", None, ("localhost", 7878)),  # leading zeros in a port are a number still
    ("[::1]:7878", None, ("::1", 7878)),
    ("[2001:db8::1]:443", None, ("2001:db8::1", 443)),
    ("[fe80::1%eth0]:7878", None, ("fe80::1%eth0", 7878)),  # a scope (link-local)
    ("[::ffff:127.0.0.1]:7878", None, ("::ffff:127.0.0.1", 7878)),  # kept as written, not canonicalised
    ("  10.0.0.1:7878 ", None, ("10.0.0.1", 7878)),  # surrounding whitespace is ignored
    ("localhost", 7878, ("localhost", 7878)),  # a bare host takes the default port
    ("10.0.0.2", 9, ("10.0.0.2", 9)),
    ("[::1]", 7878, ("::1", 7878)),
    ("::1", 7878, ("::1", 7878)),  # a bare IPv6 address that cannot be read as address:port
    ("2001:db8::1", 2379, ("2001:db8::1", 2379)),
    ("fe80::1:abcd", 1, ("fe80::1:abcd", 1)),  # its last group is not decimal: not a port
    ("h:5", 7878, ("h", 5)),  # a given port wins over the default
])
def test_every_tcp_form(text: str, default: int | None, address: tuple[str, int]) -> None:
    parsed = parse_address(text, default)
    assert parsed == address and isinstance(parsed, HostPort)
    assert (parsed.host, parsed.port) == address


def test_unix_sockets_where_a_caller_takes_them() -> None:
    assert parse_address("unix:/run/idled/core.sock", unix=True) == UnixPath("/run/idled/core.sock")
    assert parse_address("unix:relative.sock", 7878, unix=True) == UnixPath("relative.sock")
    assert parse_address("unix:/tmp/a b:c", unix=True) == UnixPath("/tmp/a b:c")  # spaces, colons: a path
    assert parse_address("[::1]:7", unix=True) == HostPort("::1", 7)  # TCP too


def test_port_zero_is_for_listening_only() -> None:
    assert parse_address("0.0.0.0:0", listen=True) == ("0.0.0.0", 0)
    assert parse_port("0", listen=True) == 0 and parse_port(" 65535 ") == 65535
    with pytest.raises(AddressError, match="port 0 is not in 1..65535"):
        parse_address("127.0.0.1:0")
    with pytest.raises(AddressError, match=r"bad port '0': out of range \(expected a number 1..65535\)"):
        parse_port("0")
    with pytest.raises(AddressError, match="bad port '65536': out of range"):
        parse_port("65536", listen=True)
    with pytest.raises(AddressError, match="bad port 'x': not a port number"):
        parse_port("x")


def test_format_writes_what_parse_reads() -> None:
    assert format_address(("127.0.0.1", 7878)) == "127.0.0.1:7878"
    assert format_address(HostPort("::1", 7878)) == "[::1]:7878" == str(HostPort("::1", 7878))
    assert format_address(("fe80::1%eth0", 1)) == "[fe80::1%eth0]:1"
    assert format_address(UnixPath("/run/x.sock")) == "unix:/run/x.sock" == str(UnixPath("/run/x.sock"))
    assert f"{HostPort('h', 1)}" == "h:1"


def test_lists() -> None:
    assert parse_addresses("a:1, b:2,a:1") == (("a", 1), ("b", 2))  # duplicates dropped, order kept
    assert parse_addresses(["a", "[::1]"], 7878) == (("a", 7878), ("::1", 7878))
    assert parse_addresses("unix:/x,h:1", unix=True) == (UnixPath("/x"), HostPort("h", 1))
    assert parse_addresses("[::1]:1,::1", 5) == (("::1", 1), ("::1", 5))
    for bad, why in [("a:1,,b:2", "an empty member"), ("a:1,", "an empty member"), ("", "no address"),
                     (" ", "no address"), ("a:1,b", "'b': no port")]:
        with pytest.raises(AddressError, match=why):
            parse_addresses(bad)
    with pytest.raises(AddressError, match="no address"):
        parse_addresses([])


# -- every refusal --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "default", "unix", "complaint"), [
    ("::1:7878", None, False, r"goes in brackets: write \[::1\]:7878 \(expected"),
    ("::1:7878", 7878, False, r"write \[::1\]:7878 \(or \[::1:7878\] for that address alone\)"),
    ("fe80::1:2", 7878, False, r"write \[fe80::1\]:2"),
    ("::1", None, False, r"no port: write \[::1\]:PORT"),
    ("::1]:7878", None, False, "'::1]:7878' is not an IPv6 address"),
    ("1:2:3", 7878, False, "'1:2:3' is not an IPv6 address"),
    ("[::1", None, False, "without its closing ']'"),
    ("[::1]x", None, False, r"'x' after '\]'"),
    ("[::1]]:1", None, False, r"'\]:1' after '\]'"),
    ("[::1]:", None, False, "no port after ':'"),
    ("[nope]:1", None, False, "brackets hold an IPv6 address, not 'nope'"),
    ("[127.0.0.1]:1", None, False, "not an IPv4 address"),
    ("[]:1", None, False, "not ''"),
    ("[fe80::1%]:1", None, False, "brackets hold"),  # an empty scope
    ("[fe80::1%a]b]:1", None, False, "after"),  # a scope cannot hold ']'
    ("[::1]", None, False, "no port"),
    ("h", None, False, r"'h': no port \(expected HOST:PORT or \[IPV6\]:PORT\)"),
    ("h:", None, False, "no port after ':'"),
    (":7878", None, False, "no host"),
    ("h:0", None, False, "port 0 is not in 1..65535"),
    ("h:65536", None, False, "port 65536 is not in 1..65535"),
    ("h:123456", None, False, "port '123456' is not a number"),
    ("h:+1", None, False, "port '\\+1' is not a number"),
    ("h: 1", None, False, "port ' 1' is not a number"),
    ("h:\u0663", None, False, "is not a number"),  # a Unicode digit: int() would read it as 3
    ("h:x", 7878, False, "port 'x' is not a number"),
    ("bad host:1", None, False, "'bad host' is not a host name"),
    ("bad/host:1", None, False, "is not a host name"),
    ("-lead.example:1", None, False, "is not a host name"),
    ("lead-.example:1", None, False, "is not a host name"),
    ("a..b:1", None, False, "is not a host name"),
    ("a.:1", None, False, "is not a host name"),  # no trailing dot
    ("b\u00fccher.example:1", None, False, "is not a host name"),  # IDNA: write its xn-- form
    ("x" * 64 + ".example:1", None, False, "is not a host name"),  # a label over 63
    (".".join(["a" * 60] * 4) + "." + "a" * 14 + ":1", None, False, "longer than 253"),
    ("127.1:1", None, False, "'127.1' is not an IPv4 address"),
    ("1.2.3.4.5:1", None, False, "is not an IPv4 address"),
    ("256.0.0.1:1", None, False, "is not an IPv4 address"),
    ("127.000.0.1:1", None, False, "is not an IPv4 address"),  # octal to inet_aton
    ("0x7f.0.0.1:1", None, False, "is not an IPv4 address"),
    ("2130706433", 7878, False, "is not an IPv4 address"),
    ("unix", 7878, False, "a host called 'unix'"),
    ("unix:/x", None, False, r"a unix socket is not taken here \(expected HOST:PORT or \[IPV6\]:PORT\)"),
    ("unix:", None, True, "unix: with no path"),
    ("unix:/a,b", None, True, "','"),
    ("unix:/a\nb", None, True, "a control character"),
    ("unix:/a\x00b", None, True, "a NUL"),
    ("unix:/" + "a" * MAX_UNIX_PATH_BYTES, None, True, f"longer than {MAX_UNIX_PATH_BYTES} bytes"),
    ("", 7878, True, r"no host \(expected HOST\[:PORT\], \[IPV6\]\[:PORT\] or unix:PATH; port 7878 if none is given\)"),
    ("a" * (MAX_ADDRESS_CHARS + 1), 7878, False, f"longer than {MAX_ADDRESS_CHARS} characters"),
])
def test_every_refusal_names_the_text_and_the_forms(text: str, default: int | None, unix: bool,
                                                     complaint: str) -> None:
    with pytest.raises(AddressError, match=complaint) as caught:
        parse_address(text, default, unix=unix)
    error = caught.value
    assert isinstance(error, ValueError) and error.text == text
    message = str(error)
    assert message.startswith("bad address ") and "\n" not in message and "(expected " in message
    assert repr(text[:80]) in message  # the bad text, cut when long
    if unix:
        assert "unix:PATH" in error.expected


# -- any address: format and parse agree; any text: a value or AddressError --------------------------------

LABELS = st.from_regex(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", fullmatch=True).filter(lambda s: s.isascii())
NAMES = (st.lists(LABELS, min_size=1, max_size=5).map(".".join)
         .filter(lambda n: len(n) <= 253 and not n.rsplit(".", 1)[-1].isdigit() and n != "unix"))
SCOPES = st.from_regex(r"[A-Za-z0-9_.-]{1,15}", fullmatch=True).filter(lambda s: s.isascii())
IPV6 = st.tuples(st.ip_addresses(v=6).map(str), st.one_of(st.none(), SCOPES)).map(
    lambda a: a[0] if a[1] is None else f"{a[0]}%{a[1]}")
HOSTS = st.one_of(NAMES, st.ip_addresses(v=4).map(str), IPV6)
PORTS = st.integers(1, 65535)
PATHS = (st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters=","), min_size=1,
                 max_size=MAX_UNIX_PATH_BYTES)
         .filter(lambda p: p == p.rstrip() and len(p.encode()) <= MAX_UNIX_PATH_BYTES))
ENDPOINTS: st.SearchStrategy[Endpoint] = st.one_of(st.builds(HostPort, HOSTS, PORTS), st.builds(UnixPath, PATHS))


@given(ENDPOINTS)
@example(HostPort("::1", 7878))
@example(HostPort("::", 1))
@example(HostPort("::ffff:1.2.3.4", 1))
@example(UnixPath(" leading space"))
def test_format_then_parse_is_the_address(address: Endpoint) -> None:
    text = format_address(address)
    assert parse_address(text, unix=True) == address
    assert parse_address(text, 7878, unix=True) == address  # a default port changes nothing written with one
    if isinstance(address, HostPort):
        assert parse_address(text) == address


@given(st.lists(ENDPOINTS, min_size=1, max_size=6))
def test_a_formatted_list_reads_back_without_its_duplicates(addresses: list[Endpoint]) -> None:
    text = format_addresses(addresses)
    assert parse_addresses(text, unix=True) == tuple(dict.fromkeys(addresses))


@given(HOSTS, st.integers(0, 65535))
def test_a_bare_host_takes_the_default_port_unless_it_could_be_address_port(host: str, default: int) -> None:
    bracketed = f"[{host}]" if ":" in host else host
    assert parse_address(bracketed, default) == (host, default)
    if ":" in host:  # unbracketed IPv6: taken unless its last group could be a port
        prefix, _, last = host.rpartition(":")
        try:
            assert parse_address(host, default) == (host, default)
        except AddressError as exc:
            assert last.isdigit() and "goes in brackets" in exc.problem


# Texts near the grammar: its punctuation, hex digits, "unix:", and whole valid addresses cut and spliced.
ALPHABET = st.sampled_from(list("[]:%.,-_ /019afxu") + ["unix:", "::", "::1", "127.0.0.1", "\x00", "\u0663", "ü"])
NEAR = st.one_of(st.lists(ALPHABET, max_size=20).map("".join),
                 st.tuples(ENDPOINTS.map(format_address), st.integers(0, 60), st.text(max_size=3)).map(
                     lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]))


@given(st.one_of(st.text(max_size=400), NEAR), st.one_of(st.none(), PORTS), st.booleans(), st.booleans())
@example("::1:7878", 7878, False, False)
@example("[::1", None, True, False)
def test_any_text_is_an_address_or_an_address_error(text: str, default: int | None, unix: bool,
                                                   listen: bool) -> None:
    try:
        address = parse_address(text, default, unix=unix, listen=listen)
    except AddressError as exc:
        assert exc.text == text and "\n" not in str(exc)  # one line, whatever the text held
        return
    # What parses is written one way, and that text reads back as the same address.
    assert parse_address(format_address(address), unix=unix, listen=listen) == address


@given(st.one_of(st.text(max_size=100), st.lists(NEAR, max_size=4).map(",".join)), st.one_of(st.none(), PORTS),
       st.booleans())
def test_any_list_is_addresses_or_an_address_error(text: str, default: int | None, unix: bool) -> None:
    try:
        addresses = parse_addresses(text, default, unix=unix)
    except AddressError:
        return
    assert addresses and len(set(addresses)) == len(addresses)
