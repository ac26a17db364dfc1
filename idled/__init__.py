"""idled: a connection-idle (presence) detector daemon."""

__version__ = "0.1.0"
