from __future__ import annotations

import pytest

from idled.core.events import PresenceEvent
from idled.protocol.tokens import AuthError, mint, verify, verify_bearer

SECRET = b"k" * 32


def test_api_tokens_name_their_holder_and_are_no_login() -> None:
    token = mint(SECRET, "api", "ops", 2000.0)
    assert verify_bearer(SECRET, token, "api", 1000.0) == "ops"
    for role in ("uid", "gateway", "observer"):
        with pytest.raises(AuthError) as info:
            verify(SECRET, token, role, "ops", 1000.0)
        assert info.value.kind == "wrong_role"
    with pytest.raises(AuthError) as info:
        verify_bearer(SECRET, mint(SECRET, "uid", "ops", 2000.0), "api", 1000.0)
    assert info.value.kind == "wrong_role"
    with pytest.raises(AuthError) as info:
        verify_bearer(SECRET, token, "api", 2000.0)
    assert info.value.kind == "expired"


def test_note_only_in_records_that_have_one() -> None:
    plain = PresenceEvent(1, "offline", "a", 1.0, "idle", 0.5, 1.5, 1.0, "ring-lazy")
    assert "note" not in plain.record() and list(plain.record()) == [
        "seq", "kind", "uid", "ts", "reason", "last_seen", "deadline", "timeout", "detector"]
    assert PresenceEvent(1, "offline", "a", 1.0, "kicked", 0.5, 1.5, 1.0, "ring-lazy", note="x").record()["note"] == "x"
