"""``idled serve --workers N``: the supervisor (``root``, ``children``), what it tells the core (``roster``,
``occupancy``), the core's internal listener for its edges (``internal``) and its view of them (``edges``,
``metrics``).
"""
