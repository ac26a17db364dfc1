"""Presence analytics on Spark over the event log, and synthetic logs to run it on.

Modules: `records` (segment bytes -> rows, via idled.log.eventlog.decode_buffer), `rules` (what every table
means), `job` (the PySpark job, run in stages by `spark`, `decode`, `pairing`, `aggregate`, `output`),
`reference` (the same rules in plain Python, for tests), `generate` (synthetic logs through the real
EventLog writer: `genconfig`, `simulation`, `synthlog`, `damage`), `report` (stdout table, PNG),
`runflags` (the job's flags, shared by `idled pipeline run` and spark-submit), `submit` (the spark-submit
entry). The `idled pipeline` command itself is `idled.cli.pipeline`. pyspark and matplotlib are imported
only inside functions.
"""
