"""Presence analytics on Spark: `idled pipeline run | generate`.

Modules: `records` (segment bytes -> rows, via idled.log.eventlog.decode_buffer), `rules` (what every table
means), `job` (the PySpark job), `reference` (the same rules in plain Python, for tests), `generate`
(synthetic logs through the real EventLog writer), `report` (stdout table, PNG), `cli`, `submit`
(spark-submit entry). pyspark and matplotlib are imported only inside functions.
"""

from idled.pipeline.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
