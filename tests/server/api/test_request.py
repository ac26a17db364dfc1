from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idled.server.api.errors import ApiError
from idled.server.api.request import NOTE_PATTERN, Kick, body_uids, kick_request, no_query, query_uids, split_target


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


def message(fn: object, *args: object) -> str:
    with pytest.raises(ApiError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.message


def test_an_integral_number_is_that_integer_uid_exactly() -> None:
    # JSON Schema's integer: any number with no fraction; read exactly (a float would make 2**53+1 another uid)
    assert body_uids(b'{"uids": [8605.0, 8.605e3, 9007199254740993.0, 9.223372036854775807e18, -0.0]}', 10) == (
        8605, 8605, 9007199254740993, 2**63 - 1, 0)
    assert kick_request(b'{"uid": 8605.0}') == Kick(8605)
    for bad in (b"1.5", b"1e-999999999", b"9223372036854775808.0", b"1e999999999", b"-1.0", b"NaN", b"Infinity"):
        assert code(body_uids, b'{"uids": [' + bad + b"]}", 10) == "bad_request", bad


@pytest.mark.parametrize("body, said", [
    (b'{"uids": ["a", ""]}', "uids[1] must be 1 to 256 UTF-8 bytes long, got 0"),
    (b'{"uids": ["' + "é".encode() * 129 + b'"]}', "uids[0] must be 1 to 256 UTF-8 bytes long, got 258"),
    (b'{"uids": [1.5]}', "uids[0] must be a string or an integer 0 to 9223372036854775807 (2**63-1), got the number 1.5"),
    (b'{"uids": [true]}', "uids[0] must be a string or an integer, got true"),
    (b'{"uids": ["\\ud800"]}', "uids[0] is not valid Unicode text (it holds an unpaired surrogate)"),
    (b'{"uids": "a"}', 'the body must be {"uids": [uid, ...]}: uids is a string'),
    (b"[1]", "the body must be a JSON object, got an array"),
    (b"\xff", "the body is not UTF-8"),
])
def test_messages_name_the_field_in_the_requests_terms(body: bytes, said: str) -> None:
    assert message(body_uids, body, 10) == said


def test_a_reason_is_refused_for_what_is_wrong_with_it() -> None:
    assert message(kick_request, b'{"uid": "a", "reason": "a\\u0007b"}') == (
        "reason must not contain control characters (U+0000-U+001F, U+007F-U+009F): found U+0007 at character 2")
    assert message(kick_request, b'{"uid": "a", "reason": 3}') == "reason must be a string, got the number 3"
    assert message(kick_request, b'{"uid": "a", "device": "' + b"d" * 65 + b'"}') == (
        "device must be 1 to 64 UTF-8 bytes long, got 65")
    assert kick_request('{"uid": "a", "reason": "é 🚫 ok"}'.encode()).note == "é 🚫 ok"


@given(st.characters())
def test_the_documents_reason_pattern_is_the_servers_rule(char: str) -> None:
    body = json.dumps({"uid": "a", "reason": char}).encode()
    accepted = True
    try:
        kick_request(body)
    except ApiError:
        accepted = False
    assert accepted == (re.fullmatch(NOTE_PATTERN, char) is not None and len(char.encode("utf-8", "replace")) <= 256
                        and not 0xD800 <= ord(char) < 0xE000), char


def test_one_rule_for_query_parameters() -> None:
    assert message(query_uids, "uid=a&foo=bar", 10) == "unknown query parameter 'foo': GET /v1/presence takes only uid"
    assert message(no_query, "x=1", "/v1/stats") == "unknown query parameter 'x': /v1/stats takes no query parameters"
    assert message(query_uids, "uid=&uid=", 10) == "uid parameter 1 must be 1 to 256 UTF-8 bytes long, got 0"
    no_query("", "/v1/stats")
