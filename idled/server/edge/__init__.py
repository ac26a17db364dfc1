"""`idled edge`: terminate user connections with the daemon's exact wire contract, relay them to a core.

An edge is the way past one process (and one machine): many edges, each holding users, report them to one
core over the gateway protocol (``attach`` at login, ``touch`` batched within 10 ms, ``detach`` at bye or
close), and the core tells each edge which sessions it ended (``ended``: idle, kicked, shutdown). Users see
no difference from a direct connection; when the core restarts they stay connected and are re-attached.

Modules: ``link`` (the core link: batching, reconnect with backoff and jitter, re-attach, notices), ``users``
(the user role, crossed notices, the relay for gateways and observers), ``app`` (lifecycle and signals).
The operator's view is docs/edge.md.
"""

from __future__ import annotations

from idled.server.edge.app import Edge

__all__ = ["Edge"]
