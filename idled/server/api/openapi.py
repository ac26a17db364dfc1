"""The API's OpenAPI 3.1 document (served at ``GET /v1/openapi.json``; tests validate real answers against it,
and Schemathesis tests a live daemon against it: tests/server/api/test_schemathesis.py).

What JSON Schema cannot say exactly is said as closely as it can and in a ``description``: a length in UTF-8
bytes (the protocol's unit) as ``maxLength`` in characters, which is necessary, not sufficient. The served
document's ``security`` says what this daemon requires: the bearer scheme with a secret, nothing without.
"""

from __future__ import annotations

from typing import Any, Final

from idled import __version__
from idled.protocol import MAX_DEVICE_BYTES, MAX_INT_UID, MAX_UID_BYTES
from idled.server.api.errors import CODES
from idled.server.api.request import MAX_NOTE_BYTES, NOTE_PATTERN

__all__ = ["OPENAPI", "schema_of", "served_document"]

_NUMBER_OR_NULL: Final = {"type": ["number", "null"]}
_STR_UID: Final = {"type": "string", "minLength": 1, "maxLength": MAX_UID_BYTES,
                   "description": f"1 to {MAX_UID_BYTES} UTF-8 bytes"}
_UID: Final = {"oneOf": [_STR_UID, {"type": "integer", "minimum": 0, "maximum": MAX_INT_UID,
                                    "description": "JSON's integers: 8605.0 and 8.605e3 are the uid 8605"}]}

_SCHEMAS: Final[dict[str, Any]] = {
    "Error": {
        "type": "object", "required": ["error"], "additionalProperties": False,
        "properties": {"error": {
            "type": "object", "required": ["code", "message"], "additionalProperties": False,
            "properties": {"code": {"enum": sorted(CODES)},
                           "message": {"type": "string", "description": "what was wrong, in the request's terms"}}}},
    },
    "Uid": _UID,
    "User": {
        "type": "object", "required": ["uid", "online", "since", "last_seen"], "additionalProperties": False,
        "properties": {
            "uid": _UID,
            "online": {"type": "boolean", "description": "a user whose offline waits out the grace is online"},
            "since": {**_NUMBER_OR_NULL, "description": "wall time (unix s) the user came online; null offline"},
            "last_seen": {**_NUMBER_OR_NULL, "description": "wall time of its last activity; null: unknown"},
            "devices": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                        "description": "devices online (only when any)"},
        },
    },
    "Presence": {
        "type": "object", "required": ["users"], "additionalProperties": False,
        "properties": {"users": {"type": "array", "items": {"$ref": "#/components/schemas/User"}}},
    },
    "PresenceRequest": {
        "type": "object", "required": ["uids"], "additionalProperties": False,
        "properties": {"uids": {"type": "array", "items": {"$ref": "#/components/schemas/Uid"}, "minItems": 1}},
        "examples": [{"uids": ["alice", 42]}],
    },
    "KickRequest": {
        "type": "object", "required": ["uid"], "additionalProperties": False,
        "properties": {"uid": {"$ref": "#/components/schemas/Uid"},
                       "device": {"type": "string", "minLength": 1, "maxLength": MAX_DEVICE_BYTES,
                                  "description": f"1 to {MAX_DEVICE_BYTES} UTF-8 bytes"},
                       "reason": {"type": "string", "maxLength": MAX_NOTE_BYTES, "pattern": NOTE_PATTERN,
                                  "description": f"at most {MAX_NOTE_BYTES} UTF-8 bytes, no control characters"}},
        "examples": [{"uid": "alice", "reason": "account suspended"}],
    },
    "Kicked": {
        "type": "object", "required": ["ended"], "additionalProperties": False,
        "properties": {"ended": {"type": "integer", "minimum": 1}},
    },
    "Stats": {
        "type": "object", "additionalProperties": False,
        "required": ["version", "uptime", "ready", "stopping", "sessions_online", "users_online", "connections",
                     "next_seq", "rates", "lateness", "workers"],
        "properties": {
            "version": {"type": "string"}, "uptime": {"type": "number"}, "ready": {"type": "boolean"},
            "stopping": {"type": "boolean"},
            "sessions_online": {"type": "integer"}, "users_online": {"type": "integer"},
            "connections": {"type": "object", "additionalProperties": {"type": "integer"}},
            "next_seq": {"type": "integer", "description": "the seq the next event gets: events published so far + 1"},
            "rates": {"type": "object", "properties": {"events_per_second_1m": _NUMBER_OR_NULL,
                                                       "events_per_second_10s": _NUMBER_OR_NULL}},
            "lateness": {"oneOf": [{"type": "null"}, {
                "type": "object", "required": ["buckets", "count", "mean"],
                "properties": {"buckets": {"type": "array", "items": {
                    "type": "object", "required": ["le", "count"],
                    "properties": {"le": _NUMBER_OR_NULL, "count": {"type": "integer"}}}},
                    "count": {"type": "integer"}, "mean": _NUMBER_OR_NULL},
                "additionalProperties": _NUMBER_OR_NULL}]},
            "workers": {"oneOf": [{"type": "null"}, {"type": "array", "items": {
                "type": "object", "required": ["name", "pid", "up", "restarts", "sessions", "connections"],
                "properties": {"name": {"type": "string"}, "pid": {"type": ["integer", "null"]},
                               "up": {"type": "boolean"}, "restarts": {"type": "integer"},
                               "sessions": {"type": "integer"}, "connections": {"type": "integer"}}}}]},
        },
    },
}


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"description": ", ".join(c for c, s in CODES.items() if s == code), "content": _json("Error")}
            for code in codes}


_COMMON: Final = (400, 401, 403, 408, 413, 421, 429, 431, 500, 503)  # 403, 421: browsers (docs/api.md)
_WITH_BODY: Final = (*_COMMON, 405, 411, 415)  # a body needs a Content-Length and Content-Type: application/json

# GET /v1/events (idled.server.api.events, docs/api.md#events): Server-Sent Events, one open response.
_EVENTS: Final[dict[str, Any]] = {"get": {
    "summary": "follow presence events as Server-Sent Events (id: the seq; event: online or offline; data: the event "
               "as JSON); resume with the Last-Event-ID header or from=",
    "parameters": [
        {"name": "uid", "in": "query", "required": False, "explode": True,
         "schema": {"type": "array", "items": {"type": "string", "minLength": 1}},
         "description": "follow only these uids (a decimal one follows the integer uid too); at most max_watch"},
        {"name": "from", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0},
         "description": "the first seq to send (default: the next event); Last-Event-ID: N means from=N+1 and wins"},
        {"name": "durable", "in": "query", "required": False, "schema": {"type": "boolean"},
         "description": "only events the log has made durable under its fsync policy"},
        {"name": "Last-Event-ID", "in": "header", "required": False,
         "schema": {"type": "string", "pattern": "^[0-9]*$"}, "description": "the last seq received: resume after it"},
    ],
    "responses": {"200": {"description": "the event stream, open until the client leaves, stalls (event: end, busy) "
                                         "or the server stops (event: end, server_shutdown); a heartbeat comment "
                                         "after api_heartbeat seconds of silence",
                          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                  **_errors(*_COMMON, 404, 405, 410)}}}

OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {"title": "idled HTTP presence API", "version": __version__,
             "description": "Presence queries, stats and kicks (docs/api.md)."},
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                       "description": "an api token: idled token --api NAME (only with a secret)"}},
    },
    "security": [{"bearer": []}, {}],
    "paths": {
        "/v1/presence": {
            "get": {"summary": "presence of the uids given as uid= parameters (strings; the request head is at most "
                               "16 KiB: large batches go by POST)",
                    "parameters": [{"name": "uid", "in": "query", "required": True, "explode": True,
                                    "schema": {"type": "array", "items": _STR_UID, "minItems": 1}}],
                    "responses": {"200": {"description": "one entry per uid, in order", "content": _json("Presence")},
                                  **_errors(*_COMMON, 405)}},
            "post": {"summary": "presence of the uids in the body (str or int, kept distinct)",
                     "requestBody": {"required": True, "content": _json("PresenceRequest")},
                     "responses": {"200": {"description": "one entry per uid, in order", "content": _json("Presence")},
                                   **_errors(*_WITH_BODY)}},
        },
        "/v1/stats": {"get": {"summary": "the daemon at a glance",
                              "responses": {"200": {"description": "stats", "content": _json("Stats")},
                                            **_errors(*_COMMON, 405)}}},
        "/v1/kick": {"post": {"summary": "end a user's sessions (or one device's) now",
                              "requestBody": {"required": True, "content": _json("KickRequest")},
                              "responses": {"200": {"description": "sessions ended", "content": _json("Kicked")},
                                            **_errors(*_WITH_BODY, 404)}}},
        "/v1/openapi.json": {"get": {"summary": "this document",
                                     "responses": {"200": {"description": "OpenAPI 3.1",
                                                           "content": {"application/json": {}}},
                                                   **_errors(*_COMMON, 405)}}},
        "/v1/events": _EVENTS,
    },
}


def schema_of(path: str, method: str, status: int) -> dict[str, Any]:
    """The response schema of one route and status, with the components beside it (for a validator)."""
    response = OPENAPI["paths"][path][method.lower()]["responses"][str(status)]
    return {**response["content"]["application/json"]["schema"], "components": OPENAPI["components"]}


_SERVED: Final = {auth: {**OPENAPI, "security": [{"bearer": []}] if auth else []} for auth in (False, True)}


def served_document(auth: bool) -> dict[str, Any]:
    """The document a daemon serves: ``security`` is the bearer scheme with auth on (every operation needs a
    token), none with auth off."""
    return _SERVED[auth]
