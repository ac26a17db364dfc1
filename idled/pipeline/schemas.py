"""The five small output tables' Spark schemas, in one place: the writers (the record path's aggregates, the
paired path's row writer) and the readers (a job reading back what it wrote, an incremental run reading the
partitions it keeps) all take them from here, so a column cannot be added, renamed or retyped in one and not
the others. Each is partitioned by ``date``; reading a partitioned table puts the partition column last
whatever the schema's order, and the readers combine frames by name (``unionByName``), never by position.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SMALL_SCHEMAS"]

SMALL_SCHEMAS: Final = {
    "concurrency": "date DATE, minute_start BIGINT, users_online BIGINT",
    "lateness": "date DATE, hour_start BIGINT, detector STRING, offlines BIGINT, early BIGINT, p50_s DOUBLE, "
                "p99_s DOUBLE, max_s DOUBLE",
    "flappers": "date DATE, uid STRING, uid_type STRING, short_sessions BIGINT, max_in_window BIGINT, "
                "first_flagged_ts DOUBLE",
    "dau": "date DATE, active_users BIGINT, sessions_started BIGINT",
    "session_lengths": "date DATE, bucket INT, label STRING, lo_s DOUBLE, hi_s DOUBLE, sessions BIGINT",
}
