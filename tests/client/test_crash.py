"""A durable observer across a SIGKILL of the daemon under load agrees with the log; a fast one need not.

The load: a gateway attaching and detaching hundreds of uids in a loop while users log in and out. Three
observers watch from seq 1 and keep a table (uid -> online?): the SQLite example (a separate process; its
checkpoint makes it durable by default), an in-process durable table, and an in-process *fast* table
(``durable=False``). The daemon runs with ``--fsync always`` on the test's disk, so each batch waits for an
fdatasync while the next one queues up unwritten -- events the fast observer already has. SIGKILL lands
in the middle of that, the daemon restarts (recovery closes what the log knows as online with reason
`restart`), every observer resumes from its last seq and catches up, and then:

* the durable tables equal the table rebuilt from the log on disk (`iter_records`, last record per uid);
* the fast table holds every event the log kept, plus any it was shown that the crash erased: each of those
  uids is wrong in it (the log's seq reservation skips the lost seqs, so nothing else is missed).
"""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.client import ClientError, Observer
from idled.client.trio import open_gateway, open_observer, open_session
from idled.log.eventlog import iter_records
from tests.client.scenarios import FAST
from tests.client.support import HOST, Idled
from tests.client.test_examples import example, wait_output

pytestmark = pytest.mark.slow

USERS = 12  # direct users logging in and out
GATEWAY_UIDS = 600  # attached and detached in waves of 300


@pytest.fixture
def idled(tmp_path: Path) -> Iterator[Idled]:
    daemon = Idled(tmp_path, "--fsync", "always").start()
    yield daemon
    daemon.kill()


def key(uid: Any) -> str:
    return repr(uid) if isinstance(uid, int) else uid  # as the SQLite example stores it: 42 and "42" differ


def log_table(data_dir: Path) -> tuple[dict[str, bool], int]:
    """uid -> online? from the last record per uid on disk, and the last seq."""
    table: dict[str, bool] = {}
    last = 0
    for record in iter_records(data_dir):
        table[key(record["uid"])] = record["kind"] == "online"
        last = record["seq"]
    return table, last


def sqlite_table(db_path: Path) -> tuple[dict[str, bool], int]:
    if not db_path.exists():
        return {}, 0
    with sqlite3.connect(db_path, timeout=10) as db:  # WAL: the example's commits do not block readers
        table = {uid: bool(online) for uid, online in db.execute("SELECT uid, online FROM presence")}
        row = db.execute("SELECT seq FROM checkpoint").fetchone()
    return table, 0 if row is None else row[0]


def replay(events: Iterator[tuple[int, str, bool]]) -> dict[str, bool]:
    """The table after applying (seq, uid, online?) in seq order."""
    table: dict[str, bool] = {}
    for _seq, uid, online in sorted(events):
        table[uid] = online
    return table


async def keep_table(observer: Observer, table: dict[str, bool], seen: list[tuple[int, str, bool]]) -> None:
    async for event in observer:
        table[key(event.uid)] = online = event.kind == "online"
        seen.append((event.seq, key(event.uid), online))


async def gateway_waves(port: int) -> None:
    try:
        async with open_gateway(HOST, port, "edge", reconnect=False) as gateway:
            wave = 0
            while True:
                first = (wave % 2) * (GATEWAY_UIDS // 2)
                await gateway.attach(range(first, first + GATEWAY_UIDS // 2), keepalive=60)
                await gateway.flush()
                await trio.sleep(0.005)
                await gateway.detach(range(first, first + GATEWAY_UIDS // 4))
                await gateway.flush()
                wave += 1
    except ClientError:
        pass  # the daemon was killed


async def user_logins(port: int, n: int) -> None:
    try:
        while True:
            async with open_session(HOST, port, f"user-{n}", keepalive=30, reconnect=False) as session:
                await session.send(n)
            await trio.sleep(0.003 * n)
    except ClientError:
        pass


async def caught_up(data_dir: Path, positions: dict[str, Any], timeout: float = 30.0) -> int:
    """Wait until the log stops growing and every observer reached its last seq; that seq."""
    with trio.fail_after(timeout):
        while True:
            _, last = await trio.to_thread.run_sync(log_table, data_dir)
            if last and all(position() == last for position in positions.values()):
                await trio.sleep(0.3)
                _, again = await trio.to_thread.run_sync(log_table, data_dir)
                if again == last:
                    return last
            await trio.sleep(0.05)


async def test_durable_observers_agree_with_the_log_after_a_sigkill_under_load(idled: Idled, tmp_path: Path) -> None:
    db_path = tmp_path / "presence.sqlite3"
    out = tmp_path / "sqlite-observer.out"
    sqlite_observer = example("sqlite_observer.py", "--idled-port", str(idled.port), "--db", str(db_path), out=out)
    durable: dict[str, bool] = {}
    fast: dict[str, bool] = {}
    durable_seen: list[tuple[int, str, bool]] = []
    fast_seen: list[tuple[int, str, bool]] = []
    try:
        await wait_output(out, "RESUMING after=0")
        async with open_observer(HOST, idled.port, "durable", after=0, backoff=FAST) as durable_observer, \
                open_observer(HOST, idled.port, "fast", after=0, durable=False, backoff=FAST) as fast_observer, \
                trio.open_nursery() as observers:
            assert durable_observer.durable and not fast_observer.durable
            observers.start_soon(keep_table, durable_observer, durable, durable_seen)
            observers.start_soon(keep_table, fast_observer, fast, fast_seen)
            async with trio.open_nursery() as load:
                load.start_soon(gateway_waves, idled.port)
                for n in range(USERS):
                    load.start_soon(user_logins, idled.port, n)
                with trio.fail_after(30):
                    while len(fast_seen) < 5000:  # well under way
                        await trio.sleep(0.01)
                assert idled.daemon is not None
                idled.daemon.proc.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(idled.daemon.proc.wait)
                fast_at_kill, durable_at_kill = len(fast_seen), len(durable_seen)
            idled.start()  # blocks the loop for a moment: the observers find out when it is back
            last = await caught_up(idled.data_dir, {
                "durable": lambda: durable_observer.position,
                "fast": lambda: fast_observer.position,
                "sqlite": lambda: sqlite_table(db_path)[1],
            })
            observers.cancel_scope.cancel()
    finally:
        sqlite_observer.kill()
        sqlite_observer.wait(10)
    records = list(iter_records(idled.data_dir))
    logged, _ = log_table(idled.data_dir)
    logged_seqs = {record["seq"] for record in records}
    erased = [seen for seen in fast_seen if seen[0] not in logged_seqs]  # shown to the fast observer, then lost
    wrong = sorted(uid for uid in fast.keys() | logged.keys() if fast.get(uid) != logged.get(uid))
    print(f"\nevents seen at the kill: fast {fast_at_kill}, durable {durable_at_kill}; log after recovery: "
          f"{len(records)} records, last seq {last}; events the fast observer saw that the crash erased: "
          f"{len(erased)}; uids wrong in its table: {len(wrong)} {wrong[:5]}")
    assert any(record["reason"] == "restart" for record in records)  # killed with sessions online
    assert durable == logged
    assert sqlite_table(db_path)[0] == logged
    assert [seen for seen in durable_seen if seen[0] not in logged_seqs] == []  # never shown a lost event
    # The fast table is the log's plus exactly the erased events: it saw every logged event, in order.
    assert logged_seqs <= {seen[0] for seen in fast_seen}
    assert fast == replay(iter([(r["seq"], key(r["uid"]), r["kind"] == "online") for r in records] + erased))
