"""Pairing: each presence record with its neighbours, and the session rows every table is built from.

One window per (user, daemon) ordered by seq; ``lag``/``lead`` give each record its neighbours, which is all
`rules` needs: an online's successor decides how its session ends; an offline whose predecessor is not an
online is an orphan. Duplicate seqs can only exist when two files of a daemon have overlapping seq ranges (a
writer's segments never do); only then does the job add the window pass that drops them (`pair` with
``dedupe``). The rows later steps read -- onlines, orphans, offlines with a deadline -- are materialized by
the caller as ``pairs``; sessions (`sessions_of`) and the lateness input (`lateness_input_of`) are
projections of it. Also here: the column helpers the tables share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from idled.pipeline.records import UID_INT, UID_STR
from idled.pipeline.rules import SUPERSEDED

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["USER", "date_of", "span", "uid_columns", "pair", "pair_count", "sessions_of", "lateness_input_of"]

# A user, as window/grouping keys: the 64-bit hash first, so sorts settle almost every comparison on an
# 8-byte prefix instead of comparing uid strings ("i:1000123" vs "i:1000124" share their first 8 bytes);
# uid_key after it keeps two users apart even if their hashes collide.
USER: Final = ("uid_hash", "uid_key")


def date_of(seconds: Column) -> Column:
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(seconds / 86400).cast("int"))


def span(start: Column, end: Column, unit: int) -> tuple[Column, Column]:
    """rules._span as columns: first and last unit index [start, end) touches."""
    from pyspark.sql import functions as F

    first = F.floor(start / unit)
    return first, F.when(end > start, F.ceil(end / unit) - 1).otherwise(first)


def uid_columns() -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.expr("substring(uid_key, 3)").alias("uid"),
        F.when(F.col("uid_key").startswith("i:"), F.lit(UID_INT)).otherwise(F.lit(UID_STR)).alias("uid_type"),
    ]


def pair(events: DataFrame, dedupe: bool) -> DataFrame:
    """Each record with its neighbours; keeps the rows later steps read: onlines (sessions), offlines that
    are orphans or carry a deadline (lateness)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy(*USER, "daemon").orderBy("seq")
    if dedupe:
        events = (
            events.withColumn("_prev_seq", F.lag("seq").over(window))
            .where(F.col("_prev_seq").isNull() | (F.col("_prev_seq") != F.col("seq")))
            .drop("_prev_seq")
        )
    orphan = ~F.col("online") & ~F.coalesce(F.lag("online").over(window), F.lit(False))
    paired = events.select(
        "daemon", "uid_hash", "uid_key", "online", "seq", "ts", "deadline", "detector", "device",
        orphan.alias("orphan"),
        F.lead("online").over(window).alias("next_online"),
        F.lead("seq").over(window).alias("next_seq"),
        F.lead("ts").over(window).alias("next_ts"),
        F.lead("reason").over(window).alias("next_reason"),
        F.lead("device").over(window).alias("next_device"),
        F.lead("grace").over(window).alias("next_grace"),
    )
    return paired.where(F.col("online") | F.col("orphan") | F.col("deadline").isNotNull())


def sessions_of(paired: DataFrame, data_end: dict[int, float]) -> DataFrame:
    from pyspark.sql import functions as F

    if data_end:
        ends = F.create_map(*[F.lit(x) for daemon, end in data_end.items() for x in (daemon, end)])[F.col("daemon")]
    else:
        ends = F.lit(None).cast("double")  # no events at all
    is_open = F.col("next_online").isNull()
    return paired.where(F.col("online")).select(
        "daemon",
        "uid_key",
        "uid_hash",
        F.col("seq").alias("online_seq"),
        F.col("ts").alias("online_ts"),
        F.col("next_seq").alias("offline_seq"),
        F.col("next_ts").alias("offline_ts"),
        (F.col("next_ts") - F.col("ts")).alias("duration_s"),
        F.when(F.col("next_online"), F.lit(SUPERSEDED)).otherwise(F.col("next_reason")).alias("end_reason"),
        is_open.alias("open"),
        F.greatest(F.coalesce(F.col("next_ts"), ends), F.col("ts")).alias("end"),
        "device",
        F.col("next_device").alias("end_device"),
        F.col("next_grace").alias("end_grace"),  # the daemon's grace, on the offline that ended it (`merge_grace`)
    )


def lateness_input_of(paired: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    # records.to_row keeps a deadline only on idle offlines
    return paired.where(~F.col("online") & F.col("deadline").isNotNull()).select(
        "detector",
        (F.floor(F.col("ts") / 3600) * 3600).alias("hour_start"),
        (F.col("ts") - F.col("deadline")).alias("lateness"),
    )


def pair_count(events: DataFrame) -> int:
    """Records left after dropping duplicate (daemon, uid, seq): one more pass, only when overlaps exist."""
    return events.dropDuplicates(["daemon", "uid_key", "seq"]).count()

