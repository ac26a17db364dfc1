"""The Host rule and the same-origin rule (idled.ops.origin), pure: which names cannot be rebound, which
Origin is the request's own."""

from __future__ import annotations

import pytest

from idled.ops.origin import local_host, same_origin


@pytest.mark.parametrize("host", [
    "127.0.0.1", "127.0.0.1:9878", "10.1.2.3:8080", "0.0.0.0", "localhost", "LocalHost:1", "localhost:65535",
    "[::1]", "[::1]:80", "[2001:db8::1]:8080", "[fe80::1%25eth0]",
])
def test_an_ip_literal_or_localhost_names_this_machine(host: str) -> None:
    assert local_host(host)


@pytest.mark.parametrize("host", [
    "evil.example", "evil.example:9878", "127.0.0.1.nip.io", "localhost.evil.example", "localhost.", "xn--localhost",
    "[::1].evil.example", "::1", "[::1", "[127.0.0.1]", "127.1", "127.0.0.1:", "127.0.0.1:80:80", "127.0.0.1:123456",
    "127.0.0.1:８０", "", " ",
])
def test_a_name_that_dns_answers_for_does_not(host: str) -> None:
    assert not local_host(host)


def test_same_origin_is_the_host_after_the_scheme() -> None:
    assert same_origin("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert same_origin("https://Idled.Example.com", "idled.example.com")
    assert same_origin("HTTP://localhost:9878", "localhost:9878")
    for origin, host in (("http://localhost:8080", "127.0.0.1:8080"),  # two origins to a browser too
                         ("http://127.0.0.1:8081", "127.0.0.1:8080"), ("http://127.0.0.1", "127.0.0.1:8080"),
                         ("http://127.0.0.1:8080/", "127.0.0.1:8080"), ("null", "127.0.0.1"), ("", "127.0.0.1"),
                         ("ftp://127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"), ("http://", "")):
        assert not same_origin(origin, host), (origin, host)
