"""The peer roles behind the doorway: the doorway itself (admission, login, dispatch: ``doorway``), users
(``users``, served together by the user plane ``plane``), gateways (``gateways``: the role and its outbox), observers
(``observers``, ``watchlists``), and how a process assembles them (``table``). The core and an edge alike.
"""
