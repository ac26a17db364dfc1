"""The presence engine of a core: the presence table as connections change it (``sessions``), expiry (``ticker``),
the event bus (``bus``) and its log-writer task (``logtask``), seq blocks (``seqs``), degraded mode
(``degraded``) and the answers to a ``query`` (``queries``). It knows no connection or role: the roles
(``idled.server.roles``) drive it.
"""
