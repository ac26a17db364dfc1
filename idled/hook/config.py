"""What one `idled hook` process is told: a frozen value the command line builds and the runner reads."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from idled.hook.batch import Filter
from idled.hook.retry import RetryPolicy
from idled.protocol import Uid
from idled.protocol.address import format_addresses, parse_addresses

__all__ = ["HookConfig", "DEFAULT_BATCH_MAX", "DEFAULT_BATCH_BYTES", "DEFAULT_BATCH_WAIT", "DEFAULT_TIMEOUT",
           "DEFAULT_STOP_GRACE", "DEFAULT_QUEUE"]

DEFAULT_BATCH_MAX: Final = 500
DEFAULT_BATCH_BYTES: Final = 1 << 20
DEFAULT_BATCH_WAIT: Final = 0.05
DEFAULT_TIMEOUT: Final = 10.0
DEFAULT_STOP_GRACE: Final = 5.0
DEFAULT_QUEUE: Final = 10_000  # events read ahead of the batcher; the observer stops reading beyond it


@dataclass(frozen=True, slots=True)
class HookConfig:
    url: str
    state_dir: str
    secret: bytes | None  # None: unsigned (--insecure-unsigned)
    host: str = "127.0.0.1"
    port: int = 7878
    token: Callable[[], str | None] = lambda: None  # called on every (re)connection: a fresh token each time
    ssl_context: ssl.SSLContext | None = None
    connect_timeout: float = 5.0
    name: str = "idled-hook"
    from_seq: int | None = None
    resync: bool = False
    uids: tuple[Uid, ...] | None = None
    filter: Filter = field(default_factory=Filter)
    batch_max: int = DEFAULT_BATCH_MAX
    batch_bytes: int = DEFAULT_BATCH_BYTES
    batch_wait: float = DEFAULT_BATCH_WAIT
    timeout: float = DEFAULT_TIMEOUT
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    ca_file: str | None = None
    stop_grace: float = DEFAULT_STOP_GRACE
    queue: int = DEFAULT_QUEUE

    @property
    def daemon(self) -> str:
        """The daemon's address, or its cores' (``A:7878, B:7878``), for a log line."""
        try:
            return format_addresses(parse_addresses(self.host, self.port), ", ")
        except ValueError:
            return self.host
