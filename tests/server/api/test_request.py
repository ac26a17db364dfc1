from __future__ import annotations

import pytest

from idled.server.api.errors import ApiError
from idled.server.api.request import Kick, body_uids, kick_request, query_uids, split_target


def code(fn: object, *args: object) -> str:
    with pytest.raises(ApiError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def test_query_uids_are_strings_in_order() -> None:
    assert query_uids("uid=b&uid=a&uid=42&uid=%C3%A9", 10) == ("b", "a", "42", "é")


def test_query_limits_and_errors() -> None:
    assert code(query_uids, "", 10) == "bad_request"
    assert code(query_uids, "uid=", 10) == "bad_request"
    assert code(query_uids, "user=a", 10) == "bad_request"
    assert code(query_uids, "&".join(["uid=a"] * 11), 10) == "too_large"
    assert code(query_uids, "&".join(["uid=a"] * 100), 10) == "too_large"
    assert code(query_uids, "uid=" + "x" * 257, 10) == "bad_request"


def test_body_uids_keep_int_and_str_apart() -> None:
    assert body_uids(b'{"uids": ["42", 42]}', 10) == ("42", 42)


@pytest.mark.parametrize("body", [b"", b"nope", b"[]", b'{"uids": "a"}', b'{"uids": []}', b'{"uids": [true]}',
                                  b'{"uids": [-1]}', b'{"uids": [1.5]}', b'{"uids": ["a"], "x": 1}',
                                  b'{"uids": [{"a": 1}]}', b'{"uids": ["\\ud800' + b"x" * 100 + b'"]}',
                                  b"[" * 100000])
def test_bad_bodies(body: bytes) -> None:
    assert code(body_uids, body, 10) == "bad_request"


def test_body_batch_limit() -> None:
    assert code(body_uids, b'{"uids": [1, 2, 3]}', 2) == "too_large"


def test_kick_request() -> None:
    assert kick_request(b'{"uid": 7}') == Kick(7)
    assert kick_request(b'{"uid": "a", "device": "phone", "reason": "spam"}') == Kick("a", "phone", "spam")
    assert kick_request(b'{"uid": "a", "reason": ""}') == Kick("a")
    for bad in (b"{}", b'{"uid": "a", "device": ""}', b'{"uid": "a", "device": 3}',
                b'{"uid": "a", "reason": 3}', b'{"uid": "a", "reason": "' + b"x" * 257 + b'"}', b'{"uid": "a", "why": 1}'):
        assert code(kick_request, bad) == "bad_request", bad


def test_split_target() -> None:
    assert split_target(b"/v1/presence?uid=a") == ("/v1/presence", "uid=a")
    assert split_target(b"/v1/stats") == ("/v1/stats", "")
    assert code(split_target, "/é".encode()) == "bad_request"
