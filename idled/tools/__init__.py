"""Benchmarks and the load generator (`idled bench`, `idled loadtest`); their commands live in `idled.cli`,
and their exit statuses are the daemon's one table (`idled.ops.fatal`)."""
