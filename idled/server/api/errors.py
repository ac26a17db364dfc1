"""The API's one error type: an HTTP status, a machine-readable code, and a message safe to show the client."""

from __future__ import annotations

from typing import Final

__all__ = ["CODES", "ApiError"]

# code -> HTTP status: every error the API answers with (docs/api.md, the OpenAPI document).
CODES: Final = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "not_online": 404,
    "method_not_allowed": 405,
    "timeout": 408,
    "gone": 410,
    "length_required": 411,
    "too_large": 413,
    "unsupported_media_type": 415,
    "misdirected_request": 421,
    "headers_too_large": 431,
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
}


class ApiError(Exception):
    """Raised by a handler (or the parsing under it) to answer ``status`` with ``{"error": {code, message}}``;
    ``headers``: extra response headers (``Retry-After``, ``WWW-Authenticate``, ``Allow``)."""

    def __init__(self, code: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = CODES[code]
        self.code = code
        self.message = message
        self.headers = headers

    def document(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}
