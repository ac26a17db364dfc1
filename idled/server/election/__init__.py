"""Leader election: lifecycle, behind the small `Election` interface (``base``), so that the server and its
tests never import an etcd client directly. `NoElection` is today's single core; `EtcdElection`
(``idled.server.election.etcd``) campaigns in etcd through its v3 JSON gateway, fenced by the lease deadline
(``lease``). See docs/election.md. It is imported from its module by whoever starts one, not here: its HTTP
client (httpx) is ~8 MiB of a process that never campaigns (issue 36)."""

from idled.server.election.base import Election, NoElection, Status, StatusBoard
from idled.server.election.errors import (
    ElectionConfigError, ElectionError, EtcdError, EtcdUnavailable, NotLeader,
)
from idled.server.election.lease import Timings
from idled.server.election.manual import ManualElection
from idled.server.election.target import EtcdTarget, parse_election_url

__all__ = [
    "Election", "NoElection", "Status", "StatusBoard", "ElectionConfigError", "ElectionError", "EtcdError",
    "EtcdUnavailable", "NotLeader", "ManualElection", "Timings", "EtcdTarget", "parse_election_url",
]
