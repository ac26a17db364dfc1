"""The ``--election`` URL parser: what it accepts, and a clear error for each thing it refuses."""

from __future__ import annotations

import pytest

from idled.server.election import ElectionConfigError, EtcdTarget, parse_election_url


def test_one_endpoint_and_a_prefix() -> None:
    target = parse_election_url("etcd://127.0.0.1:2379/idled")
    assert target == EtcdTarget((("127.0.0.1", 2379),), "/idled")
    assert target.leader_key == "/idled/leader" and target.seq_key == "/idled/seq"
    assert target.base_urls == ("http://127.0.0.1:2379",)
    assert str(target) == "etcd://127.0.0.1:2379/idled"


def test_several_endpoints_ipv6_default_port_and_a_deep_prefix() -> None:
    target = parse_election_url("etcd://etcd-1.example.org,10.0.0.2:12379,[::1]:2380/prod/idled_v1.eu-west")
    assert target.endpoints == (("etcd-1.example.org", 2379), ("10.0.0.2", 12379), ("::1", 2380))
    assert target.prefix == "/prod/idled_v1.eu-west"
    assert target.base_urls[2] == "http://[::1]:2380"
    assert parse_election_url(str(target)) == target


@pytest.mark.parametrize(("url", "complaint"), [
    ("127.0.0.1:2379/idled", "not a URL"),
    ("http://127.0.0.1:2379/idled", "scheme 'http' is not supported"),
    ("etcd://127.0.0.1:2379", "no key prefix"),
    ("etcd://127.0.0.1:2379/", "no key prefix"),
    ("etcd:///idled", "names no etcd endpoint"),
    ("etcd://a:1,,b:2/idled", "an empty member"),
    ("etcd://a:1,a:1/idled", "names an endpoint twice"),
    ("etcd://127.0.0.1:0/idled", "port 0 is not in 1..65535"),
    ("etcd://127.0.0.1:65536/idled", "port 65536 is not in"),
    ("etcd://127.0.0.1:x/idled", "port 'x'"),
    ("etcd://127.0.0.1:/idled", "no port after ':'"),
    ("etcd://::1:2379/idled", "goes in brackets: write [::1]:2379"),
    ("etcd://[::1/idled", "without its closing ']'"),
    ("etcd://[nope]:1/idled", "brackets hold an IPv6 address, not 'nope'"),
    ("etcd://[::1]x/idled", "'x' after ']' (only ':PORT' may follow)"),
    ("etcd://bad host:1/idled", "'bad host' is not a host name"),
    ("etcd://127.1:1/idled", "'127.1' is not an IPv4 address"),
    ("etcd://user:pw@h:1/idled", "credentials"),
    ("etcd://h:1/idled?x=1", "a query"),
    ("etcd://h:1/idled#top", "a fragment"),
    ("etcd://h:1/idled/", "empty segment"),
    ("etcd://h:1/a//b", "empty segment"),
    ("etcd://h:1/a/../b", "segment '..'"),
    ("etcd://h:1/a b", "segment 'a b'"),
])
def test_refused_with_the_reason(url: str, complaint: str) -> None:
    with pytest.raises(ElectionConfigError) as caught:
        parse_election_url(url)
    assert caught.value.what == "--election"
    assert complaint in str(caught.value) and "\n" not in str(caught.value)
