"""Every listening socket of idled is opened in idled/door/ (the door): a new process kind or protocol cannot
open one of its own and forget the rule, TLS or the limits. Read off the source with ``ast`` (an import or a
call inside a function counts): no call that makes a socket listen -- ``sock.listen()``, trio's
``open_tcp_listeners``/``serve_tcp`` and their SSL forms, ``socket.create_server``, asyncio's servers -- outside
the door. (``bind`` alone is allowed: a client binding its source address, or a free-port probe.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "idled"
LISTENING = {"listen", "open_tcp_listeners", "open_ssl_over_tcp_listeners", "serve_tcp", "serve_ssl_over_tcp",
             "create_server", "start_server", "start_unix_server"}


def listening_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in LISTENING:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {name}()")
    return found


def test_no_module_outside_the_door_makes_a_socket_listen() -> None:
    outside = [call for path in sorted(ROOT.rglob("*.py")) if "door" not in path.relative_to(ROOT).parts[:1]
               for call in listening_calls(path)]
    assert outside == []
    assert listening_calls(ROOT / "door" / "door.py"), "the scan finds nothing: it is broken"
