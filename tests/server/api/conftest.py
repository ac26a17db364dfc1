from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.peers import Harness, free_port, running


@asynccontextmanager
async def api_server(tmp_path: Path, **settings: Any) -> AsyncIterator[Harness]:
    """An in-process server with the HTTP API on a real loopback port (``harness.server.api.port``)."""
    async with running(tmp_path, api_port=free_port(), settle=False, **settings) as harness:
        yield harness
