"""``GET /v1/events``'s parameters, parsed (pure): where to start, which uids, durable or not."""

from __future__ import annotations

import pytest

from idled.server.api.errors import ApiError
from idled.server.api.events import Follow, end_text, follow_request, sse_text
from idled.server.engine.bus import event_frame


def test_parameters_and_the_last_event_id() -> None:
    assert follow_request("", [], 10) == Follow(None, None, False)
    assert follow_request("from=5&durable=true", [], 10) == Follow(5, None, True)
    assert follow_request("from=5", ["41"], 10) == Follow(42, None, False)  # the header wins
    assert follow_request("", [" "], 10) == Follow(None, None, False)  # an empty one: none
    assert follow_request("uid=alice&uid=42", [], 10) == Follow(None, ("alice", "42", 42), False)
    assert follow_request("uid=007", [], 10).uids == ("007",)  # not the integer 7


@pytest.mark.parametrize("query, last, code", [
    ("from=-1", [], "bad_request"), ("from=1.5", [], "bad_request"), ("from=1&from=2", [], "bad_request"),
    ("from=99999999999999999999", [], "bad_request"), ("durable=yes", [], "bad_request"),
    ("nope=1", [], "bad_request"), ("uid=", [], "bad_request"), ("x", [], "bad_request"),
    ("", ["1", "2"], "bad_request"), ("", ["abc"], "bad_request"),
    ("uid=a&uid=b&uid=c", [], "too_large"),
])
def test_refusals(query: str, last: list[str], code: str) -> None:
    with pytest.raises(ApiError) as caught:
        follow_request(query, last, 2)
    assert caught.value.code == code, caught.value.message


def test_the_event_text_is_one_line_of_json_per_field() -> None:
    record = {"seq": 7, "kind": "offline", "uid": "a\nb", "ts": 1.5, "reason": "idle", "last_seen": 1.0,
              "deadline": 1.5, "note": "x\r\ny"}
    text = sse_text(event_frame(record)).decode()
    assert text == ('id: 7\nevent: offline\ndata: {"seq":7,"kind":"offline","uid":"a\\nb","ts":1.5,'
                    '"reason":"idle","last_seen":1.0,"deadline":1.5,"note":"x\\r\\ny"}\n\n')
    assert end_text("busy", "why").decode() == 'event: end\ndata: {"code":"busy","message":"why"}\n\n'
