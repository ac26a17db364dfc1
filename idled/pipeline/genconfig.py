"""The settings of `idled pipeline generate` (see `idled.pipeline.generate` for what each one does)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from idled.log.eventlog import DEFAULT_SEGMENT_BYTES

__all__ = ["GenConfig", "DEFAULT_START", "DEVICE_NAMES"]

DEFAULT_START: Final = 1_777_593_600.0  # 2026-05-01T00:00:00Z
DEVICE_NAMES: Final = ("phone", "laptop", "tablet", "desktop", "watch", "tv", "car", "web")


@dataclass(frozen=True, slots=True)
class GenConfig:
    out: str
    users: int
    hours: float
    seed: int = 1
    daemons: int = 1
    start: float = DEFAULT_START
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    flappers: float = 0.005  # fraction of users
    crashes: int = 2  # per daemon
    maintenance: int = 1  # graceful restarts per daemon
    damage: bool = False  # one corrupt record and a torn tail per daemon (see idled.pipeline.generate)
    batch: int = 2048  # events per EventLog.append
    devices: int = 0  # > 0: each login is on one of this many devices per user, and events carry "device"
    grace: float = 0.0  # the simulated daemon's offline_grace: closed offlines delayed, dropped on a quick login

    def __post_init__(self) -> None:
        if self.users < 1 or not self.hours > 0 or self.daemons < 1:
            raise ValueError("need users >= 1, hours > 0, daemons >= 1")
        if not 0 <= self.flappers <= 1 or self.crashes < 0 or self.maintenance < 0:
            raise ValueError("need 0 <= flappers <= 1, crashes >= 0, maintenance >= 0")
        if not 0 <= self.devices <= len(DEVICE_NAMES) or not 0.0 <= self.grace <= 3600.0:
            raise ValueError(f"need 0 <= devices <= {len(DEVICE_NAMES)}, 0 <= grace <= 3600")

    def daemon_dir(self, daemon: int) -> str:
        return self.out if self.daemons == 1 else os.path.join(self.out, f"daemon-{daemon}")
