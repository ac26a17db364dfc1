"""A log-linear (HDR-style) histogram of non-negative values, and an exact percentile of a list.

Theory of operation
-------------------
HDR-style log-linear buckets over non-negative integers (microseconds by default). With ``sub_bits = 11``
the first 2048 buckets hold the values 0..2047 exactly; above that every power of two is split into 1024
equal buckets, so a recorded value is off by at most 1/1024 (~0.1 %, three significant digits) whatever its
size. Worked through: 3000 µs has bit length 12, shift = 1, bucket = 2048 + 0 * 1024 + (3000 >> 1) - 1024 =
2524, which holds 3000..3001. Buckets live in a dict, so an idle histogram costs a few hundred bytes and
merging two (from worker processes) adds counts. `value_at_percentile(p)` walks buckets in order to the
first cumulative count >= ceil(p% of total) and returns that bucket's highest equivalent value (clamped to
the exact min / max), as HdrHistogram does; `hgrm()` gives the familiar percentile table with five rows per
halving of the remaining distance to 100 %. Between processes a histogram travels as `to_dict()`, whose
bucket counts are ``[index, count]`` pairs (the pipe's decoder accepts string map keys only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["percentile", "Histogram"]


def percentile(values: list[float] | list[int], fraction: float) -> float:
    """The exact order statistic at ``fraction`` (nearest rank, no interpolation); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


class Histogram:
    """Log-linear histogram of non-negative values; `unit` is the value of one integer step (1e-6 = µs)."""

    __slots__ = ("_counts", "_sub_bits", "unit", "count", "total", "min", "max")

    def __init__(self, unit: float = 1e-6, sub_bits: int = 11) -> None:
        if not unit > 0:
            raise ValueError(f"unit must be positive, got {unit!r}")
        if not 2 <= sub_bits <= 20:
            raise ValueError(f"sub_bits must be in 2..20, got {sub_bits!r}")
        self._counts: dict[int, int] = {}
        self._sub_bits = sub_bits
        self.unit = unit
        self.count = 0
        self.total = 0.0  # exact sum of recorded values
        self.min = math.inf  # exact (may be negative: such values were clamped to bucket 0)
        self.max = -math.inf

    # -- bucket arithmetic (integers) --

    def _index(self, v: int) -> int:
        sub = 1 << self._sub_bits
        if v < sub:
            return v
        shift = v.bit_length() - self._sub_bits
        return sub + (shift - 1) * (sub >> 1) + ((v >> shift) - (sub >> 1))

    def _bounds(self, index: int) -> tuple[int, int]:
        """(lowest, highest) integer value of a bucket."""
        sub = 1 << self._sub_bits
        if index < sub:
            return index, index
        half = sub >> 1
        shift = (index - sub) // half + 1
        mantissa = (index - sub) % half + half
        low = mantissa << shift
        return low, low + (1 << shift) - 1

    # -- recording --

    def record(self, value: float, n: int = 1) -> None:
        """Record `value` (seconds, for the default unit) `n` times; negative values land in bucket 0."""
        if n <= 0:
            return
        if not math.isfinite(value):
            raise ValueError(f"cannot record {value!r}")
        steps = max(0, round(value / self.unit))
        index = self._index(steps)
        self._counts[index] = self._counts.get(index, 0) + n
        self.count += n
        self.total += value * n
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        if other.unit != self.unit or other._sub_bits != self._sub_bits:
            raise ValueError("cannot merge histograms of different unit or precision")
        for index, n in other._counts.items():
            self._counts[index] = self._counts.get(index, 0) + n
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    # -- reading --

    def value_at_percentile(self, percentile: float) -> float:
        """The value at or below which `percentile` % of recorded values fall (highest equivalent value)."""
        if not self.count:
            return math.nan
        p = min(100.0, max(0.0, percentile))
        wanted = max(1, math.ceil(p / 100.0 * self.count - 1e-9))
        seen = 0
        for index in sorted(self._counts):
            seen += self._counts[index]
            if seen >= wanted:
                high = self._bounds(index)[1] * self.unit
                return min(self.max, max(self.min, high))
        return self.max  # pragma: no cover - counts always add up to self.count

    def _cumulative(self) -> Iterator[tuple[float, int]]:
        seen = 0
        for index in sorted(self._counts):
            seen += self._counts[index]
            yield min(self.max, self._bounds(index)[1] * self.unit), seen

    def summary(self) -> dict[str, float | int | None]:
        """count, min, mean, p50, p90, p99, p99.9, max (seconds); None for an empty histogram."""
        if not self.count:
            return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None, "p99": None,
                    "p99_9": None, "max": None}
        return {
            "count": self.count,
            "min": self.min,
            "mean": self.total / self.count,
            "p50": self.value_at_percentile(50.0),
            "p90": self.value_at_percentile(90.0),
            "p99": self.value_at_percentile(99.0),
            "p99_9": self.value_at_percentile(99.9),
            "max": self.max,
        }

    def hgrm(self, ticks_per_half_distance: int = 5, max_rows: int = 400) -> list[dict[str, float | int]]:
        """Rows of an HdrHistogram `.hgrm` percentile table: value, percentile (0..1), total count, 1/(1-p)."""
        rows: list[dict[str, float | int]] = []
        if not self.count:
            return rows
        cumulative = list(self._cumulative())
        pos = 0
        percentile = 0.0
        while len(rows) < max_rows:
            wanted = max(1, math.ceil(percentile / 100.0 * self.count - 1e-9))
            while cumulative[pos][1] < wanted:
                pos += 1
            value, seen = cumulative[pos]
            if percentile == 0.0:
                value = self.min  # the table starts at the exact minimum
            rows.append({"value": value, "percentile": percentile / 100.0, "total_count": seen,
                         "inverse": (1.0 / (1.0 - percentile / 100.0)) if percentile < 100.0 else math.inf})
            if wanted >= self.count:
                break
            halvings = int(math.log2(100.0 / (100.0 - percentile))) + 1
            percentile += 100.0 / (ticks_per_half_distance * 2**halvings)
        if rows[-1]["percentile"] < 1.0:
            rows.append({"value": self.max, "percentile": 1.0, "total_count": self.count, "inverse": math.inf})
        return rows

    def hgrm_text(self, scale: float = 1e3, unit_name: str = "ms") -> str:
        """The table as text, values multiplied by `scale` (default: seconds shown as milliseconds)."""
        lines = [f"{'Value(' + unit_name + ')':>14} {'Percentile':>14} {'TotalCount':>10} {'1/(1-Percentile)':>17}", ""]
        for row in self.hgrm():
            inverse = row["inverse"]
            inv = f"{inverse:17.2f}" if math.isfinite(inverse) else f"{'inf':>17}"
            lines.append(f"{row['value'] * scale:14.3f} {row['percentile']:14.12f} {row['total_count']:10d} {inv}")
        if self.count:
            lines.append(f"#[Mean    = {self.total / self.count * scale:12.3f}, Max     = {self.max * scale:12.3f}]")
            lines.append(f"#[Count   = {self.count:12d}, Min     = {self.min * scale:12.3f}]")
        return "\n".join(lines) + "\n"

    # -- transport between processes --

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "sub_bits": self._sub_bits, "counts": [[index, n] for index, n in self._counts.items()], "count": self.count,
                "total": self.total, "min": self.min if self.count else None, "max": self.max if self.count else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        h = cls(unit=float(data["unit"]), sub_bits=int(data["sub_bits"]))
        counts = data["counts"]
        for index, n in (counts.items() if isinstance(counts, Mapping) else counts):  # a dict: older documents
            h._counts[int(index)] = int(n)
        h.count = int(data["count"])
        h.total = float(data["total"])
        if h.count:
            h.min = float(data["min"])
            h.max = float(data["max"])
        return h
