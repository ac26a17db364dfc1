"""Build a detector by name: the one place that knows every implementation.

Kept apart from `idled.core.detector` (the interface), which the implementations import: the interface never
imports them back, so there is no cycle.
"""

from __future__ import annotations

from typing import Final, Literal

from idled.core.baselines import DeadlineHeap, FullScan
from idled.core.detector import DEFAULT_CHUNK, Detector
from idled.core.wheel import TimingWheel

__all__ = ["DETECTOR_KINDS", "DEFAULT_CHUNK", "make_detector"]

DETECTOR_KINDS = ("ring-eager", "ring-lazy", "scan", "heap")
_RING_POLICIES: Final[dict[str, Literal["eager", "lazy"]]] = {"ring-eager": "eager", "ring-lazy": "lazy"}


def make_detector(kind: str, *, timeout: int, slots: int = 30) -> Detector:
    """Build a detector by name (as `idled bench` and `idled serve --detector` spell them)."""
    if kind in _RING_POLICIES:
        return TimingWheel(timeout=timeout, slots=slots, policy=_RING_POLICIES[kind])
    if kind == "scan":
        return FullScan(timeout=timeout)
    if kind == "heap":
        return DeadlineHeap(timeout=timeout)
    raise ValueError(f"unknown detector {kind!r}; expected one of {', '.join(DETECTOR_KINDS)}")
