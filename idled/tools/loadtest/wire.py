"""What a user connection of the load test speaks: idled's frames, the same as WebSocket messages, or MQTT.

Theory of operation
-------------------
The user engine (`idled.tools.loadtest.engine`) does the same things whatever the protocol: open a connection,
send a login and wait for its acceptance, send a keepalive on schedule and read the answer, stop (silent) or
say bye, and time the end. Only the bytes differ, so one run picks a `Wire` (the worker configuration's
``wire``: ``idled`` -- with ``websocket`` set, the same frames as binary WebSocket messages -- or ``mqtt``) and
the engine asks it for them:

* the constant frames: `ping`, `quiet` (a keepalive that asks for no answer: idled's `{"op":"msg"}`, MQTT's
  PUBLISH at QoS 0 to a topic nobody subscribes to; ``--ask-one-in``), `bye` and `pong` (the answer the
  engine's hot path compares a whole read with);
* `login(i, uid)`: the first bytes of session i (an idled login, after the WebSocket upgrade with
  ``websocket``; an MQTT CONNECT with client identifier ``lt<uid>`` and the keepalive in whole seconds);
* `cut(data, limit)` -> (whole frames, tail) and `parse(frame)` -> a message: idled's own messages, and for
  MQTT the same three kinds the engine acts on -- a CONNACK with return code 0 is a `Welcome` (its timeout
  the MQTT rule, 1.5 x the keepalive, since a 3.1.1 broker says nothing of it), a PINGRESP a `Pong`, a
  refusing CONNACK an `Error` (code ``connack_<rc>``); any other packet is returned as it is and ignored;
* `closes_are_events`: an MQTT broker tells nobody but the client that a session ended -- it closes the
  socket -- so with MQTT the worker reports each close of a logged-in session (and each CONNACK) as the
  presence event the observer reports for idled (`idled.tools.loadtest.conntable`).

Everything here is pure (bytes in, bytes out); the MQTT packets themselves are `idled.tools.loadtest.mqtt`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from idled.core.timeouts import KEEPALIVE_FACTOR
from idled.protocol import BYE_FRAME, PING_FRAME, PONG, PONG_FRAME, QUIET_FRAME, ErrorCode, Login, ProtocolError, Welcome, encode
from idled.protocol.messages import Error
from idled.tools.loadtest import mqtt
from idled.tools.loadtest.frames import (
    WS_BYE, WS_PING, WS_PONG, WS_QUIET, cut_frames, cut_ws_messages, login_frame, login_templates, server_message,
    ws_client_frame, ws_upgrade,
)
from idled.tools.loadtest.workerstate import Worker

__all__ = ["WIRES", "Wire", "wire_for", "mqtt_message", "cut_mqtt", "mqtt_client_id"]

WIRES: Final = ("idled", "mqtt")
MQTT_QUIET: Final = mqtt.publish("k")  # (one topic for all: the broker finds no subscriber and drops it)


@dataclass(frozen=True, slots=True)
class Wire:
    name: str  # "idled", "websocket" (idled's frames in WebSocket messages) or "mqtt"
    ping: bytes
    quiet: bytes
    bye: bytes
    pong: bytes
    cut: Callable[[bytes, int], tuple[list[bytes], bytes]]
    parse: Callable[[bytes], object]
    login: Callable[[int, int], bytes]  # (session index, uid) -> the session's first bytes
    closes_are_events: bool = False


def mqtt_client_id(uid: int) -> str:
    """The client identifier of the session with ``uid`` (23 characters at most, [0-9a-z]: any 3.1.1 broker
    must accept it, MQTT-3.1.3-5)."""
    return f"lt{uid}"


def cut_mqtt(data: bytes, limit: int) -> tuple[list[bytes], bytes]:
    """`mqtt.cut_packets`, its errors as the engine's `ProtocolError` (the engine closes the connection)."""
    try:
        return mqtt.cut_packets(data, limit)
    except mqtt.MqttError as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"mqtt: {exc}") from None


def mqtt_message(packet: bytes, keepalive: float) -> object:
    """One server packet as the message the engine acts on (see the module docstring)."""
    if packet == mqtt.PINGRESP:  # the commonest by far
        return PONG
    try:
        msg = mqtt.parse_packet(packet)
    except mqtt.MqttError as exc:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"mqtt: {exc}") from None
    if isinstance(msg, mqtt.Connack):
        if msg.return_code:
            return Error(f"connack_{msg.return_code}", "the broker refused the connection")
        return Welcome("uid", 0, timeout=KEEPALIVE_FACTOR * keepalive)
    return msg


def wire_for(w: Worker) -> Wire:
    """The wire of worker ``w``'s configuration (``wire``, ``websocket``)."""
    name = w.cfg.get("wire") or "idled"
    if name == "mqtt":
        keepalive = w.keepalive
        seconds = int(keepalive)
        if seconds != keepalive:
            raise ValueError(f"an MQTT keepalive is whole seconds, got {keepalive!r}")
        return Wire("mqtt", mqtt.PINGREQ, MQTT_QUIET, mqtt.DISCONNECT, mqtt.PINGRESP, cut_mqtt,
                    lambda packet: mqtt_message(packet, keepalive),
                    lambda i, uid: mqtt.connect(mqtt_client_id(uid), seconds), closes_are_events=True)
    if name != "idled":
        raise ValueError(f"unknown wire {name!r} (one of {', '.join(WIRES)})")
    login = _idled_login(w)
    if w.cfg.get("websocket"):  # the upgrade, the login right behind it (frames.py says why)
        host, port = w.host, w.port
        return Wire("websocket", WS_PING, WS_QUIET, WS_BYE, WS_PONG, cut_ws_messages, server_message,
                    lambda i, uid: ws_upgrade(host, port) + ws_client_frame(login(i, uid)[4:]))
    return Wire("idled", PING_FRAME, QUIET_FRAME, BYE_FRAME, PONG_FRAME, cut_frames, server_message, login)


def _idled_login(w: Worker) -> Callable[[int, int], bytes]:
    """Session i's login frame: ``--devices K`` logs session i in as device ``"d<i % K>"``. Without a secret
    the K frames differ only in the uid, so each is encoded once around a placeholder uid and patched per login
    (`frames.login_templates`): no Login object or msgpack encode per login."""
    devices = w.devices
    if w.secret is None:
        templates = login_templates(w.keepalive, devices)
        return lambda i, uid: login_frame(templates[i % devices], uid)

    def signed(i: int, uid: int) -> bytes:
        device = f"d{i % devices}" if devices > 1 else None
        return encode(Login("uid", uid, w.token("uid", uid), w.keepalive, device=device))

    return signed
