"""Leader election: lifecycle, behind the small `Election` interface (``base``), so that the server and its
tests never import an etcd client directly. `NoElection` is today's single core; `EtcdElection` campaigns
in etcd through its v3 JSON gateway, fenced by the lease deadline (``lease``). See docs/election.md."""

from idled.server.election.base import Election, NoElection, Status, StatusBoard
from idled.server.election.errors import (
    ElectionConfigError, ElectionError, EtcdError, EtcdUnavailable, NotLeader,
)
from idled.server.election.etcd import EtcdElection
from idled.server.election.lease import Timings
from idled.server.election.manual import ManualElection
from idled.server.election.target import EtcdTarget, parse_election_url

__all__ = [
    "Election", "NoElection", "Status", "StatusBoard", "ElectionConfigError", "ElectionError", "EtcdError",
    "EtcdUnavailable", "NotLeader", "EtcdElection", "ManualElection", "Timings", "EtcdTarget", "parse_election_url",
]
