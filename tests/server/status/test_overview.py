"""The /status parts beyond the sizes (idled.server.status.overview): config summary, workers, rate, lateness."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, cast

from idled.ops.config import Config
from idled.server.status.overview import settings_part, status_part, workers_part
from idled.server.status.vitals import Sample, Vitals
from idled.server.workers.edges import Workers


def test_the_settings_part_says_what_shapes_behaviour_and_nothing_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    cfg = Config(tick=0.5, timeout=20.0, fsync="always", secret_file=str(secret), workers=2)
    summary = settings_part(cfg)
    assert summary["tick"] == 0.5 and summary["timeout"] == 20.0 and summary["fsync"] == "always"
    assert summary["auth"] is True and summary["workers"] == 2 and summary["max_connections"] == cfg.max_connections
    assert str(secret) not in json.dumps(summary) and "secret" not in " ".join(summary)
    assert settings_part(Config())["auth"] is False


class FakeSupervisor:
    public = [object()]  # the public listener the edges share

    def view(self) -> list[tuple[str, int | None, int, int, int]]:
        return [("worker-0", 1234, 0, 10, 11), ("worker-1", None, 3, 0, 0)]


def test_workers_part_and_status_part() -> None:
    workers = cast(Workers, FakeSupervisor())
    assert workers_part(workers) == [
        {"name": "worker-0", "pid": 1234, "up": True, "restarts": 0, "sessions": 10, "connections": 11},
        {"name": "worker-1", "pid": None, "up": False, "restarts": 3, "sessions": 0, "connections": 0},
    ]
    vitals = Vitals(lambda wall: Sample(wall, 0, 0, {}, int(wall * 5)),
                    lateness=lambda: ([0.1, 1.0, float("inf")], [3.0, 4.0, 4.0], 0.5))
    for second in range(3):
        vitals.sample(float(second), functools.partial(float, second))
    part: dict[str, Any] = status_part(Config(), workers, vitals)
    assert part["events_per_second"] == 5.0 and len(part["workers"]) == 2
    assert part["lateness"] == {"count": 4, "mean": 0.125, "p50": 0.1, "p90": 1.0, "p99": 1.0, "p99_9": 1.0}
    assert "workers" not in status_part(Config(), None, Vitals(lambda wall: Sample(wall, 0, 0, {}, 0)))
