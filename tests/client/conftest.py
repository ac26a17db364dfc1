"""Fixtures of the client tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.support import Idled


@pytest.fixture
def idled(tmp_path: Path) -> Iterator[Idled]:
    """A real `idled serve` on a free port (short tick and timeout; see tests.client.support.Idled)."""
    daemon = Idled(tmp_path).start()
    yield daemon
    daemon.kill()
