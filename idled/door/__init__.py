"""The door: how every idled process opens its listeners and admits connections (``door.py`` first).

* ``door``: the listeners of a process (``Endpoint``, ``Door``): the rule (no listener beyond loopback
  without a secret, unless ``--insecure``), binding or adopting systemd's sockets, the gates per listener;
* ``gate``: what every connection passes before its protocol sees it: a share per source address of the
  connections not yet authenticated, the PROXY header, TLS;
* ``accept``: the accept loop (descriptors running out, a full edge that pauses);
* ``tls``: TLS contexts (server and client side), the PROXY/TLS front, certificate identities;
* ``outbound``: the links a process opens to another core (standby, follower, edge, relays): TLS when
  configured, and which failures are a configuration one side cannot speak (fatal at start);
* ``addresses``: how an address is shown, whether it is local, whose share it counts against.

Above ``ops`` (it reads the configuration, raises ``Fatal``); below ``server`` and ``hook``, whose listeners
(and links) it opens.
"""
