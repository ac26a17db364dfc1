"""Shared fixtures of the pipeline tests: one local SparkSession per test session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from idled.pipeline.job import start_spark

    session = start_spark("local[2]", driver_memory="2g", shuffle_partitions=2)
    yield session
    session.stop()
