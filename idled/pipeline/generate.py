"""Synthetic presence event logs, written with the daemon's real `EventLog` writer.

Theory of operation
-------------------
Each daemon is simulated on its own (one process per daemon, up to the CPU count) over its share of the
users (user i belongs to daemon i % D). The simulation is a heap of per-user next actions, so events come out
in time order, seqs strictly increase, and memory stays O(users) however many events are written:

* **Sessions.** A user logs in, stays a lognormal time (median 4 min), and the session ends by ``idle`` (45 %:
  the last keepalive is at the end of the activity, the offline fires at ``deadline + lateness``),
  ``closed`` (25 %), ``logout`` (20 %), ``gateway_lost`` or ``detach``. The next login follows an exponential
  gap whose mean follows a diurnal curve (busiest at 20:00 UTC, quietest at 08:00). Calibrated so that
  100,000 users x 24 h is about 10 million events.
* **Lateness** is what a tick-driven detector gives: uniform within one 1 s tick plus scheduling jitter
  (ms), plus rare loop stalls for the ``heap`` detector. Daemon d runs detector
  ``("ring-lazy", "heap", "scan", "ring-eager")[d % 4]``.
* **Flappers** (``--flappers`` of the users) have one or two bursts of 6-25 sessions of 2-45 s, 3-30 s apart.
* **Crashes** (``--crashes`` per daemon): the writer dies mid-record (half a record is written), the log is
  reopened after 5-60 s with `EventLog.recover()` -- which truncates the torn record and reports the uids
  left online -- and one ``offline``/``restart`` is appended for each, as the server does. Their users
  reconnect 1-30 s later; logins due during the outage wait for the restart.
* **Maintenance** (``--maintenance`` per daemon): a graceful stop, ``offline``/``shutdown`` for everyone,
  and a restart 5-20 s later.
* **Devices** (only with ``--devices K`` / ``GenConfig.devices``): each login is on one of K devices
  (``phone``, ``laptop``, ...) drawn from a generator of its own, so the sessions are the ones of a log
  without devices; onlines, and offlines ending a session, carry ``"device"`` (restart offlines only if
  `EventLog.recover()`'s online record has one: it keeps a minimal record, so they have none). The daemon's events are user-level, so a user has one session at a time here.
* **Grace** (only with ``--grace G`` / ``GenConfig.grace``): the daemon's ``offline_grace``. A ``closed``
  session's offline is held G seconds; a login within them continues the session without any event, else
  the offline is written then with its original ts and ``"grace": G`` (a later seq than other users' events
  after its ts). A graceful stop writes the held offlines at once; a crash loses them (the restart offline
  closes the session, as the server's recovery does).
* **Duplicate logins** produce no event in the daemon (newest wins, no flap), so there is nothing to write.
* **Damage** (only with ``--damage`` / ``GenConfig.damage``; logs are clean by default): after the run, one
  record about 40 % into the log gets a flipped body byte (its CRC fails) and most of a record is appended
  to the last segment (a torn tail), so the pipeline's skip-and-count paths can be exercised.

uids: mostly ints; every 10th user a name ("user-<i>"), and every 100th (i % 100 == 1) the *string* form of
its neighbour's int uid -- ``"1000100"`` next to ``1000100`` -- so the pipeline has to keep 42 and "42" apart.

Modules: `genconfig` (the settings), `simulation` (the behaviour above), `synthlog` (writing, crashes and
recovery through `EventLog`), `damage` (the corrupt record and torn tail); this one runs the daemons.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Final

from idled.log.eventlog import list_segments
from idled.pipeline.damage import corrupt_record, tear_tail
from idled.pipeline.genconfig import DEFAULT_START, GenConfig
from idled.pipeline.simulation import DETECTORS, DaemonSimulation, detector_for, uid_for
from idled.pipeline.synthlog import SyntheticLog

# GenConfig, DEFAULT_START, DETECTORS and uid_for live in genconfig and simulation; re-exported so this module
# stays the one import for callers.
__all__ = ["GenConfig", "DaemonStats", "generate", "run_daemon", "DETECTORS", "DEFAULT_START", "uid_for"]

_CORRUPT_AT: Final = 0.4  # damage: the first record written this far into the time span is corrupted


@dataclass(frozen=True, slots=True)
class DaemonStats:
    directory: str
    detector: str
    users: int
    events: int
    restart_offlines: int
    shutdown_offlines: int
    crashes: int
    truncated_bytes: int  # torn records cut off by recover() after the simulated crashes
    corrupted_seq: int | None  # the record whose body byte was flipped
    torn_tail_bytes: int
    bytes: int
    segments: int
    seconds: float


def run_daemon(config: GenConfig, daemon: int) -> DaemonStats:
    """Simulate daemon `daemon`, write its log, damage it if asked; the stats of what was written."""
    started = time.perf_counter()
    directory = config.daemon_dir(daemon)
    log = SyntheticLog(
        directory, segment_bytes=config.segment_bytes, batch=config.batch, detector=detector_for(daemon),
        watch_after=config.start + _CORRUPT_AT * (config.hours * 3600.0),
    )
    simulation = DaemonSimulation(config, daemon, log)
    simulation.run()
    torn = 0
    corrupted: int | None = None
    if config.damage:
        corrupted = corrupt_record(directory, log.first_after)
        torn = tear_tail(directory, log.seq + 1, simulation.end)
    segments = list_segments(directory)
    size = sum(os.path.getsize(p) for _, p in segments)
    return DaemonStats(
        directory=directory, detector=log.detector, users=len(simulation.users), events=log.events,
        restart_offlines=simulation.restarts, shutdown_offlines=simulation.shutdowns, crashes=config.crashes,
        truncated_bytes=log.truncated, corrupted_seq=corrupted, torn_tail_bytes=torn, bytes=size,
        segments=len(segments), seconds=time.perf_counter() - started,
    )


def _run_daemon(args: tuple[GenConfig, int]) -> DaemonStats:
    return run_daemon(*args)  # Pool.map passes one argument


def generate(config: GenConfig, *, processes: int | None = None) -> list[DaemonStats]:
    """Write every daemon's log under config.out; daemons run in parallel processes when there are several."""
    os.makedirs(config.out, exist_ok=True)
    jobs = [(config, d) for d in range(config.daemons)]
    workers = min(config.daemons, processes or os.cpu_count() or 1)
    if workers <= 1:
        return [_run_daemon(job) for job in jobs]
    import multiprocessing

    # spawn, not fork: the caller may be a process with threads (a test session running Spark).
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return pool.map(_run_daemon, jobs)
