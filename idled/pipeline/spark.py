"""Starting Spark for the job: a SparkSession configured for a small machine, and row materialization.

Local workers are child processes that must run this interpreter (msgpack and idled live in its
environment), so `start_spark` points ``PYSPARK_PYTHON`` at it; a log4j2 file written once to the temp
directory keeps Spark's console quiet. pyspark is imported inside the functions: importing this module
never loads it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

__all__ = ["spark_conf", "start_spark", "materialize", "agg_row", "is_local", "is_loopback", "master_of"]

# Root at WARN: Spark compares the root level with its own default (WARN) when the driver is Python and
# prints "Setting default log level to ..." if they differ. The chatty WARN sources are raised to ERROR.
_LOG4J: Final = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.window.name = org.apache.spark.sql.execution.window
logger.window.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def is_local(master: str | None) -> bool:
    return master is not None and master.startswith("local")


def is_loopback(master: str | None) -> bool:
    """A standalone master on this machine (spark://127.x or localhost): the driver must listen there too."""
    if master is None or not master.startswith("spark://"):
        return False
    hosts = [h.rsplit(":", 1)[0] for h in master[len("spark://"):].split(",")]
    return all(h == "localhost" or h.startswith("127.") for h in hosts)


# JVM options of a session that only schedules Python tasks (`light_jvm`): the C1 compiler alone and the serial
# collector. Such a JVM runs little code -- task plumbing -- so C2's compile threads and the parallel
# collector's threads only compete with the Python workers for the cores, most of all while the driver and
# the executors start together: on the standalone cluster of `cluster` (2 cores), the hourly run took 12.5 s
# with them against 17.5 s without, a few seconds apart. Not for Spark SQL work (the record path), which C2
# speeds up.
LIGHT_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_conf(
    master: str | None, *, driver_memory: str = "6g", shuffle_partitions: int = 4, progress: bool = False,
    light_jvm: bool = False,
) -> dict[str, str]:
    """Settings for a small machine: quiet, no UI, few shuffle partitions, UTC.

    `progress`: Spark's console progress bar (stages and task counts, redrawn in place on stderr); the
    caller asks for it only when stderr is a terminal, so piped output carries nothing extra. `light_jvm`:
    the driver's and executors' JVMs with `LIGHT_JVM_OPTIONS` (a session for the paired path)."""
    conf = {
        "spark.app.name": "idled-pipeline",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true" if progress else "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": driver_memory,
        # Materialized row blocks (`materialize`) are serialized; Kryo writes UnsafeRows as raw bytes.
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    }
    log4j = os.path.join(tempfile.gettempdir(), f"idled-pipeline-log4j2-{os.getuid()}.properties")
    try:
        with open(log4j) as file:
            current = file.read()
    except FileNotFoundError:
        current = None
    if current != _LOG4J:
        with open(log4j + ".tmp", "w") as file:
            file.write(_LOG4J)
        os.replace(log4j + ".tmp", log4j)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    if light_jvm:
        conf["spark.driver.extraJavaOptions"] += " " + LIGHT_JVM_OPTIONS
        conf["spark.executor.extraJavaOptions"] = LIGHT_JVM_OPTIONS
    if is_local(master) or is_loopback(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def start_spark(
    master: str | None = "local[*]",
    *,
    driver_memory: str = "6g",
    shuffle_partitions: int = 4,
    extra_conf: Sequence[tuple[str, str]] = (),
    progress: bool = False,
    light_jvm: bool = False,
) -> SparkSession:
    """A SparkSession for the job. master None: whatever spark-submit configured. `light_jvm`: see
    `spark_conf` (a session that only schedules Python tasks)."""
    if is_local(master):
        # Local workers are child processes: they must run this interpreter to import msgpack and idled.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    conf = spark_conf(master, driver_memory=driver_memory, shuffle_partitions=shuffle_partitions, progress=progress,
                      light_jvm=light_jvm)
    conf.update(extra_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def materialize(frame: DataFrame) -> DataFrame:
    """Compute `frame` once and keep its rows for the several queries that read it.

    A local checkpoint stores Spark's binary rows as they are, Kryo-serialized (memory, spilling to disk);
    `cache()` re-encodes them into compressed column batches, the top frame of sampled executor stacks, and
    keeping them deserialized cost ~30 CPU-seconds of GC at 10M events. The plan is cut here and the frame's
    partitioning (by user) is kept for later steps. Blocks are freed when the DataFrame is garbage-collected.
    """
    from pyspark import StorageLevel

    return frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


def agg_row(frame: DataFrame) -> Row:
    """The one row of `frame`, an aggregate without a grouping (``df.agg(...)``): it has exactly one row, even
    over no input, so ``first()`` never returns None here (pyspark types it Optional for the general case)."""
    row = frame.first()
    if row is None:
        raise RuntimeError("an aggregate without groupBy returned no row")
    return row


def master_of(spark: SparkSession) -> str:
    """The master URL of `spark`'s context. pyspark types it Optional (it reads ``spark.master`` with a
    plain conf get), but SparkContext refuses to start without ``spark.master``, so a running session has one."""
    master = spark.sparkContext.master
    if master is None:
        raise RuntimeError("the SparkContext has no spark.master")
    return master
