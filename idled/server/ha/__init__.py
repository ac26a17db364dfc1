"""High availability, the core-to-core part: the active core's side of log shipping (``feed``: serve a
standby's ``replicate`` from the log) and the standby's side (``follow``: the link that copies it). The
standby process itself is ``idled.server.standby``; leadership and the fence are ``idled.server.election``.
"""
