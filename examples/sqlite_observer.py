"""An observer that keeps a table of who is online in SQLite, and never loses an event.

Every event is applied in ONE transaction that also stores its seq as the checkpoint, so the table and the
checkpoint can never disagree: after a crash of this process (even `kill -9`) it starts again from the stored
checkpoint (`after=`), and after a restart of idled the client resumes by itself from the last seq it
received. Delivery is at-least-once; an event whose seq is not beyond the checkpoint is a duplicate and is
skipped. The `history` table (seq PRIMARY KEY) shows every event was applied exactly once.

Because it starts from a checkpoint, the observer reads the *durable* view by default: idled sends it only
events already in its event log (under idled's `--fsync` policy). So a crash of idled itself cannot leave
this table holding an event the log lost: after idled restarts, the table equals the one its log rebuilds
(tests/client/test_crash.py checks exactly that across a SIGKILL under load). The price is latency: ~1-2 ms
under `--fsync always`, up to the sync interval (1 s) under `interval`.

    python examples/sqlite_observer.py --idled-port 7878 --db presence.sqlite3
"""

from __future__ import annotations

import argparse
import sqlite3

import trio

from idled.client import Gone
from idled.client.trio import open_observer
from idled.protocol import Event

SCHEMA = """
CREATE TABLE IF NOT EXISTS presence (uid TEXT PRIMARY KEY, online INTEGER NOT NULL, since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY, uid TEXT NOT NULL, kind TEXT NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS checkpoint (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL);
"""


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT below
    # WAL: readers of the table never wait for this writer. synchronous=NORMAL: a power cut may lose the last
    # commits, but never splits an event from its checkpoint, and the durable subscription still holds
    # those events on the server: we read them again.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    return db


def stored_checkpoint(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT seq FROM checkpoint WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])  # 0: nothing processed yet, read from the first event ever


def apply(db: sqlite3.Connection, event: Event) -> bool:
    """Apply one event and advance the checkpoint atomically; False for a duplicate."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if event.seq <= stored_checkpoint(db):
            db.execute("ROLLBACK")
            return False
        uid = repr(event.uid) if isinstance(event.uid, int) else event.uid  # 42 and "42" are different uids
        db.execute("INSERT OR REPLACE INTO presence VALUES (?, ?, ?)", (uid, event.kind == "online", event.ts))
        db.execute("INSERT INTO history VALUES (?, ?, ?, ?)", (event.seq, uid, event.kind, event.reason))
        db.execute("INSERT OR REPLACE INTO checkpoint VALUES (1, ?)", (event.seq,))
        db.execute("COMMIT")
        return True
    except BaseException:
        db.execute("ROLLBACK")
        raise


async def main(args: argparse.Namespace) -> None:
    db = open_db(args.db)
    while True:
        after = stored_checkpoint(db)
        print(f"RESUMING after={after}", flush=True)
        try:
            async with open_observer(args.idled_host, args.idled_port, args.name, after=after) as observer:
                async for event in observer:
                    apply(db, event)
        except Gone as exc:
            # The events after our checkpoint were pruned: the table cannot be repaired from the stream. Start
            # over from what is retained (a real app would also re-query the uids it shows).
            print(f"GONE: {exc}; restarting from {exc.oldest_seq}", flush=True)
            db.execute("DELETE FROM presence")
            db.execute("INSERT OR REPLACE INTO checkpoint VALUES (1, ?)", ((exc.oldest_seq or 1) - 1,))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idled-host", default="127.0.0.1")
    parser.add_argument("--idled-port", type=int, default=7878)
    parser.add_argument("--name", default="sqlite-table", help="observer name")
    parser.add_argument("--db", default="presence.sqlite3")
    try:
        trio.run(main, parser.parse_args())
    except KeyboardInterrupt:
        pass
