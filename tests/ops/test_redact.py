"""What an unauthenticated client may read of /status (idled.ops.redact): an allowlist, and free text scrubbed.

The documents here hold every field the active core, the leader under --election and the standby put in
/status (idled.ops.health, idled.server.app / overview / replication / standby), each naming a user, a peer, an
address or a path wherever the real one can; the redacted text must hold none of them."""

from __future__ import annotations

import json
from typing import Any

from idled.ops.redact import ALLOWED, redact_status, scrub_paths

DATA = "/srv/idled-secretdir"
NAMES = ("gw-payments-7", "standby-db3.internal", "10.1.2.3", "etcd.internal", "idled-db3.internal")

ACTIVE: dict[str, Any] = {
    "version": "0.1.0", "uptime_seconds": 12.5, "ready": False,
    "ready_reason": f"event log directory {DATA} is not writable: No space left on device",
    "connections": {"user": 3, "gateway": 1, "observer": 2, "pending": 0}, "sessions_online": 3, "users_online": 2,
    "detector_keys": 3, "detector_overflow_keys": 0, "observer_queued_bytes": 0, "eventlog_damaged_bytes": 0,
    "eventlog_damaged_records": 0, "eventlog_rolls_deferred": 0, "sessions_held": 1,
    "gateway_watermark_lag": {"gw-payments-7": 2.5}, "next_seq": 42, "ports": [7878], "stopping": False,
    "data_dir": DATA,
    "replication": {"sync_standby": True, "sync_attached": True, "durable_seq": 41, "log_durable_seq": 41,
                    "records_sent": 40, "standbys": [{"name": "standby-db3.internal", "acked": 41, "sent": 41,
                                                      "sync": True}]},
    "config": {"tick": 0.1, "timeout": 30.0, "auth": True, "tls": False, "fsync": "interval"},
    "events_per_second": 1.5, "lateness": {"count": 1, "mean": 0.05, "p50": 0.05, "p90": 0.05, "p99": 0.05,
                                           "p99_9": 0.05},
    "workers": [{"name": "worker-0", "pid": 4242, "up": True, "restarts": 0, "sessions": 3, "connections": 3}],
    "role": "leader",
    "election": {"target": "http://etcd.internal:2379", "advertise": "idled-db3.internal:7878", "lease_left": 4.2},
}
STANDBY: dict[str, Any] = {
    "version": "0.1.0", "uptime_seconds": 3.0, "ready": True, "ready_reason": "ready", "role": "standby",
    "connections": {"observer": 1}, "next_seq": 42, "ports": [7879], "stopping": False, "data_dir": DATA,
    "standby": {"active": "10.1.2.3:7878", "state": "retrying", "connected": False, "last_seq": 41,
                "active_durable_seq": 41, "lag_records": 0, "lag_seconds": 0.0, "records": 41, "resyncs": 0,
                "reconnects": 2, "synced": True,
                "error": f"cannot write the replicated log ([Errno 28] No space left on device: '{DATA}/00000001.seg')"},
}


def test_nothing_naming_a_peer_an_address_or_a_path_survives() -> None:
    for document in (ACTIVE, STANDBY):
        text = json.dumps(redact_status(document, [DATA]))
        for name in (DATA, *NAMES, "/srv"):
            assert name not in text, (name, text)
        assert '"/' not in text and "'/" not in text


def test_what_says_how_the_daemon_is_stays() -> None:
    active = redact_status(ACTIVE, [DATA])
    assert active["redacted"] is True
    for key in ("version", "ready", "connections", "sessions_online", "users_online", "next_seq", "ports", "config",
                "lateness", "events_per_second", "role", "workers", "sessions_held"):
        assert active[key] == ACTIVE[key], key
    assert active["ready_reason"] == "event log directory <data dir> is not writable: No space left on device"
    assert active["replication"] == {"sync_standby": True, "sync_attached": True, "durable_seq": 41,
                                     "log_durable_seq": 41, "records_sent": 40,
                                     "standbys": [{"acked": 41, "sent": 41, "sync": True}]}
    assert active["election"] == {"lease_left": 4.2}
    assert "data_dir" not in active and "gateway_watermark_lag" not in active
    standby = redact_status(STANDBY, [DATA])["standby"]
    assert "active" not in standby and standby["state"] == "retrying" and standby["reconnects"] == 2
    assert standby["error"] == ("cannot write the replicated log ([Errno 28] No space left on device: "
                                "'<data dir>/00000001.seg')")


def test_a_field_nobody_allowed_stays_out() -> None:
    """The allowlist's point: a field added to the document later is not published until someone says so."""
    redacted = redact_status({**ACTIVE, "recent_uids": ["alice"], "config": ACTIVE["config"]}, [DATA])
    assert "recent_uids" not in redacted and "recent_uids" not in ALLOWED
    assert redact_status({"replication": None, "standby": None, "workers": None}) == {
        "replication": None, "standby": None, "workers": None, "redacted": True}


def test_scrub_paths() -> None:
    known = ["data", "/var/lib/idled"]
    cases = {
        "event log directory /var/lib/idled is not writable: Read-only file system":
            "event log directory <data dir> is not writable: Read-only file system",
        "event log directory data is not writable: x": "event log directory <data dir> is not writable: x",
        "metadata and database": "metadata and database",  # a relative data dir only as a whole word
        "[Errno 2] No such file or directory: '/etc/idled/secret'": "[Errno 2] No such file or directory: '<path>'",
        "open ~/x, ./y and (../z)": "open <path>, <path> and (<path>)",
        "events/s 1/2 a / b": "events/s 1/2 a / b",  # a slash is not a path
        "not listening for clients (starting or shutting down)": "not listening for clients (starting or shutting down)",
        # another machine's address, in a standby's link error
        "cannot connect (all attempts to connect to 127.0.0.77:17999 failed)":
            "cannot connect (all attempts to connect to <address> failed)",
        "the active at [2001:db8::1]:7878 refused: not_allowed": "the active at <address> refused: not_allowed",
        "nothing from core-b.internal:7878 for 5 s, 10.0.0.1 too": "nothing from <address> for 5 s, <address> too",
        "lag 1.5 s at 12:30 (seq 3:4)": "lag 1.5 s at 12:30 (seq 3:4)",  # a time or a seq range is no address
        "at 12:30:45 (seqs 1:2:3)": "at 12:30:45 (seqs 1:2:3)",
        # unbracketed IPv6, as a socket address tuple prints it, and a bare name as TLS quotes it
        "refused by ('::1', 7878, 0, 0)": "refused by ('<address>', 7878, 0, 0)",
        "from 2001:db8::7 and fe80::1%eth0 and ::ffff:10.0.0.1": "from <address> and <address> and <address>",
        "to 2001:0db8:0000:0000:0000:ff00:0042:8329 and back": "to <address> and back",
        "certificate is not valid for 'core-b.internal'": "certificate is not valid for '<address>'",
    }
    for text, expected in cases.items():
        assert scrub_paths(text, known) == expected, text
