"""The state directory of incremental runs: ``state.json``, the commit journal, and which bytes are new.

See `idled.pipeline.incremental` for what the state holds and why. Here: loading it (refusing a state made
for other inputs, ``--out`` or flap parameters), `pending_work` (the files, and offsets in them, not yet
decoded: a new file from 0, a grown one from the end of its last good record), and the journal that makes
a run's commit atomic -- the moves (a staged partition replacing one, a staged file added to one, a
partition or file deleted) and the new ``state.json`` are written to ``journal.json`` first
(``os.replace``), then applied; `apply_journal` is idempotent (a move whose source is gone was done, a
deletion of what is gone is done) and runs again at the next start if a run was interrupted. Plain file
I/O, no pyspark.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from idled.pipeline.rules import FlapParams

__all__ = ["VERSION", "StateError", "State", "load_state", "pending_work", "apply_journal", "replace_json", "file_totals_of",
           "staged_files", "added_moves", "session_moves", "apply_moves", "Move"]

# 2: a run adds files to the sessions partitions and keeps open sessions in files of their own
# (``open_files``); a version-1 --out mixes open rows into the partitions' files.
# 3: the sessions table has the device columns (``device``, ``end_device``) and the carried open sessions
# their device; a version-2 --out's sessions files lack them (and its open sessions' devices are lost).
VERSION: Final = 3


Move = tuple["str | None", str]  # (source, target) of a journal: a file or partition moved in, or deleted


class StateError(Exception):
    """The state directory does not fit this run (other inputs, flap parameters or --out)."""


@dataclass
class State:
    path: str
    data: dict[str, Any]

    @property
    def generation(self) -> int:
        return int(self.data.get("generation", 0))

    def gen_dir(self, generation: int | None = None) -> str:
        return os.path.join(self.path, f"gen-{self.generation if generation is None else generation}")


def _empty_state(names: Sequence[str], out: str, flap: FlapParams) -> dict[str, Any]:
    return {
        "version": VERSION, "generation": 0, "inputs": list(names), "out": os.path.abspath(out),
        "flap": [flap.k, flap.short_s, flap.window_s],
        "daemons": {str(i): {"files": {}, "max_seq": None, "data_end": None} for i in range(len(names))},
        "counts": {"events": 0, "duplicates": 0, "sessions": 0, "open_sessions": 0, "superseded": 0, "orphans": 0},
        "first_minute": None, "closed_last_minute": None, "last_minute": None,
        "open_files": [],  # the open sessions' files, relative to --out: the next run deletes them
    }


def replace_json(path: str, data: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as file:
        json.dump(data, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(path + ".tmp", path)


def apply_moves(moves: list[Move]) -> None:
    """Each (source, target): `target` replaced by `source`, or deleted if the source is None. Idempotent: a
    move whose source is gone was done (an interrupted run's), a deletion of what is gone is done."""
    for source, target in moves:
        if source is not None and not os.path.exists(source):
            continue  # moved before an interruption
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)
        if source is not None:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(source, target)


def date_moves(staged_root: str, target_root: str, dates: Iterable[str]) -> list[Move]:
    """Moves putting each staged date partition in place of ``target_root``'s (a date with no staged partition
    any more: the target's is deleted)."""
    moves: list[Move] = []
    for date in dates:
        staged = os.path.join(staged_root, f"date={date}")
        moves.append((staged if os.path.isdir(staged) else None, os.path.join(target_root, f"date={date}")))
    return moves


def commit_journal(state_dir: str, moves: list[Move], new_state: dict[str, Any]) -> None:
    """Journal ``moves`` with the state they lead to (the commit point of a run), then apply them."""
    replace_json(os.path.join(state_dir, "journal.json"), {"moves": moves, "state": new_state})
    apply_journal(state_dir)


def apply_journal(state_dir: str) -> None:
    """Finish a committed run: move staged partitions into place, then install the new state. Idempotent."""
    journal_path = os.path.join(state_dir, "journal.json")
    if not os.path.exists(journal_path):
        return
    with open(journal_path) as file:
        journal = json.load(file)
    apply_moves(journal["moves"])
    replace_json(os.path.join(state_dir, "state.json"), journal["state"])
    os.remove(journal_path)
    for name in os.listdir(state_dir):
        if name == "staging" or (name.startswith("gen-") and name != f"gen-{journal['state']['generation']}"):
            shutil.rmtree(os.path.join(state_dir, name), ignore_errors=True)


def staged_files(root: str) -> list[tuple[str, str]]:
    """(partition directory name, file name) of every data file Spark wrote under `root` (none if absent);
    checksums and markers (names starting with ``.`` or ``_``) are left out."""
    if not os.path.isdir(root):
        return []
    found: list[tuple[str, str]] = []
    for partition in sorted(os.listdir(root)):
        if partition.startswith(("_", ".")) or not os.path.isdir(os.path.join(root, partition)):
            continue
        found.extend((partition, name) for name in sorted(os.listdir(os.path.join(root, partition)))
                     if not name.startswith(("_", ".")))
    return found


def load_state(state_dir: str, names: Sequence[str], out: str, flap: FlapParams) -> State:
    """The state in `state_dir` (new if there is none), after finishing an interrupted run's journal."""
    os.makedirs(state_dir, exist_ok=True)
    apply_journal(state_dir)
    path = os.path.join(state_dir, "state.json")
    if not os.path.exists(path):
        return State(state_dir, _empty_state(names, out, flap))
    with open(path) as file:
        data = json.load(file)
    if data.get("version") != VERSION:
        why = " (its sessions table has no device columns)" if data.get("version") == 2 else ""
        raise StateError(f"{state_dir}: state version {data.get('version')}, expected {VERSION} (made by an older "
                         f"idled whose --out this one cannot update{why}); use a new --state and --out")
    if data["inputs"] != list(names):
        raise StateError(f"{state_dir}: made for --events {' '.join(data['inputs'])}; use a new --state for other inputs")
    if data["out"] != os.path.abspath(out):
        raise StateError(f"{state_dir}: made for --out {data['out']}")
    if data["flap"] != [flap.k, flap.short_s, flap.window_s]:
        raise StateError(f"{state_dir}: made with flap parameters k, short, window = {data['flap']}")
    return State(state_dir, data)


def pending_work(state: State) -> list[tuple[int, str, int, int]]:
    """(daemon, path, offset, seq watermark) for every file with bytes not yet decoded."""
    work = []
    for index, name in enumerate(state.data["inputs"]):
        daemon = state.data["daemons"][str(index)]
        watermark = daemon["max_seq"] if daemon["max_seq"] is not None else -1
        for entry in sorted(os.scandir(name), key=lambda e: e.name):
            if not (entry.name.endswith(".seg") and entry.is_file()):
                continue
            size = entry.stat().st_size
            known = daemon["files"].get(entry.name)
            if known is None:
                work.append((index, entry.path, 0, watermark))
            elif size < known["consumed"]:
                work.append((index, entry.path, 0, watermark))  # rewritten: decode again, the watermark filters
            elif size > known["consumed"] and size != known["size"]:  # grown (or its torn tail rewritten)
                work.append((index, entry.path, known["consumed"], watermark))
    return work


def file_totals_of(data: dict[str, Any]) -> dict[str, int]:
    """The summary's file counters from the state (every file ever decoded, deleted ones included)."""
    totals = {"files": 0, "bytes": 0, "records": 0, "corrupt": 0, "malformed": 0, "torn_bytes": 0, "broken_files": 0,
              "daemons_with_overlapping_files": 0}
    for daemon in data["daemons"].values():
        for entry in daemon["files"].values():
            totals["files"] += 1
            totals["bytes"] += entry["size"]
            totals["torn_bytes"] += entry["torn_bytes"]
            totals["broken_files"] += int(entry["broken"])
            for name in ("records", "corrupt", "malformed"):
                totals[name] += entry[name]
    return totals



def added_moves(staged_root: str, target_root: str, prefix: str) -> list[tuple[str, str]]:
    """Each file staged under `staged_root` into the same partition of `target_root`, its name prefixed."""
    return [(os.path.join(staged_root, partition, name), os.path.join(target_root, partition, prefix + name))
            for partition, name in staged_files(staged_root)]


def session_moves(state: State, generation: int, closed_root: str, open_root: str, out: str) -> tuple[list[Move], list[str]]:
    """The moves that put a run's staged sessions (closed under `closed_root`, open under `open_root`, each
    partitioned by date) into ``out/sessions``, and the open ones' files relative to `out`. The previous
    run's open files are deleted (their sessions are all in this run's); a first run replaces whole
    partitions (whatever --out held there is not this state's)."""
    target = os.path.join(out, "sessions")
    moves: list[Move] = [(None, os.path.join(out, rel)) for rel in state.data["open_files"]]
    opens = added_moves(open_root, target, f"open-g{generation}-")
    closed = added_moves(closed_root, target, f"g{generation}-")
    if state.generation > 0:
        moves += closed + opens
    else:
        for source, destination in opens:
            moved = os.path.join(closed_root, os.path.relpath(destination, target))
            os.makedirs(os.path.dirname(moved), exist_ok=True)
            os.rename(source, moved)
        moves += [(os.path.join(closed_root, p), os.path.join(target, p)) for p in {p for p, _ in staged_files(closed_root)}]
    return moves, [os.path.relpath(destination, out) for _, destination in opens]
