"""`idled hook --redrive`: post the dead letters again, oldest first, and clear each once acknowledged.

Theory of operation
-------------------
The redrive holds the state directory's lock, so it runs while the hook is stopped and nothing appends to
the dead-letter file meanwhile. It works on a file of its own, so that "sent" and "cleared" move together
through crashes:

1. ``dead-letter.jsonl`` is renamed to ``dead-letter.redrive.jsonl`` (one atomic rename, the directory
   fsynced) -- unless a redrive file is already there: a redrive that crashed, which is resumed first.
2. ``dead-letter.redrive.offset`` (``{"offset": N}``, replaced atomically like the checkpoint) says how many
   bytes of the redrive file are done. Each line after it is posted -- the same body, the same
   ``webhook-id`` as its first delivery, signed afresh -- with the hook's retry policy, and only after its 2xx
   does the offset move past it. A crash therefore re-posts at most the line in flight.
3. At the end the redrive file is removed, then the offset file. A crash between the two leaves an offset
   with no redrive file: it belongs to a finished redrive and is removed before any new rename (step 1), so
   it can never apply to a file it was not written for.

Then the loop looks again (a resumed redrive may be followed by the dead letters of a later run). A line
that fails for the whole retry budget stops the redrive (`RedriveStopped`): it and the lines after it stay
in the redrive file for the next ``--redrive``; nothing is dead-lettered twice. A line that is not a dead
letter, or an offset that does not fall on a line boundary, stops it too (`StateError` ``damaged``) with
nothing changed: the operator decides, no guess drops or re-sends data.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Final

import trio
from prometheus_client import CollectorRegistry

from idled.hook.batch import Batch
from idled.hook.config import HookConfig
from idled.hook.deliver import Deliverer, Shutdown
from idled.hook.metrics import HookMetrics
from idled.hook.post import Poster
from idled.hook.state import DEAD_LETTER, REDRIVE_FILE, StateDir, StateError

__all__ = ["REDRIVE_FILE", "REDRIVE_OFFSET", "RedriveStopped", "parse_letter", "run_redrive"]

log = logging.getLogger("idled.hook")

REDRIVE_OFFSET: Final = "dead-letter.redrive.offset"
MAX_LINE: Final = 64 << 20  # a dead letter holds one batch (--batch-bytes, at most a few MiB); beyond: damaged


class RedriveStopped(Exception):
    """A dead letter failed again for the whole retry budget; it and the rest wait for the next --redrive."""


def parse_letter(line: bytes) -> Batch:
    """A dead-letter line as the batch it holds (its events' JSON as stored); ValueError if it is not one."""
    letter = json.loads(line)
    events = letter["batch"]["events"]
    if not isinstance(events, list) or not events:
        raise ValueError("no events")
    encoded = tuple((int(event["seq"]), float(event["ts"]),
                     json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()) for event in events)
    batch = Batch(encoded, encoded[-1][0])
    if letter.get("delivery", batch.delivery_id) != batch.delivery_id:
        raise ValueError(f"delivery {letter['delivery']!r} is not its events' first-last seq")
    return batch


class _Redriver(Deliverer):
    """The deliverer's retry loop; giving up stops the redrive instead of dead-lettering again."""

    async def give_up(self, batch: Batch, failures: int, error: str, elapsed: float) -> bool:
        raise RedriveStopped(f"delivery {batch.delivery_id} failed again, {failures} attempts over {elapsed:.0f} s "
                             f"(last error: {error})")


class _Letters:
    """The redrive file's lines after ``offset``, one at a time (a file of many batches is never all in memory);
    `StateError` damaged for an offset off a line boundary or a torn line."""

    def __init__(self, path: str, offset: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 -- closed by close(), across awaits
        # (past the file's end, including a number seek cannot take -- OverflowError beyond a C long -- is no
        # line boundary of it)
        if offset > os.fstat(self._file.fileno()).st_size:
            self.close()
            raise StateError("damaged", f"{REDRIVE_OFFSET} ({str(offset)[:40]}) is not a line boundary of "
                                        f"{REDRIVE_FILE}; fix or remove it")
        if offset:
            self._file.seek(offset - 1)
            if self._file.read(1) != b"\n":
                self.close()
                raise StateError("damaged", f"{REDRIVE_OFFSET} ({offset}) is not a line boundary of "
                                            f"{REDRIVE_FILE}; fix or remove it")

    def next(self) -> tuple[int, bytes] | None:
        """(the offset after the line, the line), or None at the end."""
        line = self._file.readline(MAX_LINE + 1)
        if not line:
            return None
        if not line.endswith(b"\n"):
            raise StateError("damaged", f"{REDRIVE_FILE}: the line at byte {self._file.tell() - len(line)} is torn "
                                        f"or longer than {MAX_LINE} bytes; fix or remove it")
        return self._file.tell(), line

    def close(self) -> None:
        self._file.close()


def _read_offset(state: StateDir) -> int:
    try:
        with open(os.path.join(state.path, REDRIVE_OFFSET), "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        return 0
    try:
        offset: Any = json.loads(raw)["offset"]
    except (ValueError, KeyError, TypeError):
        offset = None
    if type(offset) is not int or offset < 0:
        raise StateError("damaged", f"{REDRIVE_OFFSET} is not {{\"offset\": N}}: {raw[:80]!r}; fix or remove it")
    return offset


def _next_file(state: StateDir) -> bool:
    """Make sure the redrive file holds the next dead letters to send; False if there are none (all cleared)."""
    path = os.path.join(state.path, REDRIVE_FILE)
    if os.path.exists(path):
        return True  # a redrive that did not finish: resume it at its offset
    offset_path = os.path.join(state.path, REDRIVE_OFFSET)
    if os.path.exists(offset_path):  # a finished redrive's, left by a crash between the two removals
        os.unlink(offset_path)
        state.fsync_dir()
    try:
        os.rename(os.path.join(state.path, DEAD_LETTER), path)
    except FileNotFoundError:
        return False
    state.fsync_dir()
    return True


def _finish(state: StateDir) -> None:
    os.unlink(os.path.join(state.path, REDRIVE_FILE))
    state.fsync_dir()
    try:
        os.unlink(os.path.join(state.path, REDRIVE_OFFSET))
    except FileNotFoundError:
        return  # an empty redrive file: no offset was ever written
    state.fsync_dir()


async def _redrive_one(redriver: _Redriver, state: StateDir, end: int, line: bytes) -> bool:
    """Post one dead letter until a 2xx, then move the offset past it; False: shutdown came first."""
    try:
        batch = parse_letter(line)
    # OverflowError: a seq of 1e400 (int of an infinite float); RecursionError: a line nested past the parser's
    # depth. Both are damage like a missing field: one line naming it, not a traceback.
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise StateError("damaged", f"{REDRIVE_FILE}: the line ending at byte {end} is not a dead letter ({exc}); "
                                    "fix or remove it") from None
    if not await redriver.send(batch):
        return False
    await trio.to_thread.run_sync(state.replace, REDRIVE_OFFSET, json.dumps({"offset": end}).encode() + b"\n")
    log.info("redriven: delivery %s (%d events)", batch.delivery_id, len(batch.events))
    return True


async def run_redrive(config: HookConfig, shutdown: Shutdown) -> int:
    """Redrive every dead letter of ``config.state_dir``; the number sent. `RedriveStopped`, `StateError`."""
    state = await trio.to_thread.run_sync(StateDir, config.state_dir)
    sent = 0
    try:
        async with Poster(config.url, timeout=config.timeout, ca_file=config.ca_file) as poster:
            redriver = _Redriver(config, state, poster, HookMetrics(CollectorRegistry()), shutdown, committed=None)
            while not shutdown.stopping and await trio.to_thread.run_sync(_next_file, state):
                offset = await trio.to_thread.run_sync(_read_offset, state)
                letters = await trio.to_thread.run_sync(_Letters, os.path.join(state.path, REDRIVE_FILE), offset)
                try:
                    while (letter := await trio.to_thread.run_sync(letters.next)) is not None:
                        if not await _redrive_one(redriver, state, *letter):
                            return sent  # stopping: the line in flight stays
                        sent += 1
                finally:
                    letters.close()
                await trio.to_thread.run_sync(_finish, state)
    except OSError as exc:
        raise StateError("io", f"redriving: {exc.strerror or exc}", errno=exc.errno) from None
    finally:
        state.close()
    return sent
