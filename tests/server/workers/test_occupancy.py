"""The edges' shared connection counters (idled.server.workers.occupancy): one memfd, a slot per edge."""

from __future__ import annotations

import os

import pytest

from idled.server.workers.occupancy import Occupancy, parse_occupancy


def test_every_edge_sees_the_others_counts() -> None:
    fd, views = Occupancy.create(3)
    try:
        views[0].publish(19_000)
        views[1].publish(12)
        assert views[2].total() == 19_012 and views[2].counts() == [19_000, 12, 0]
        assert views[0].elsewhere(budget=19_000)  # slots 1 and 2 have room
        views[1].publish(19_000)
        views[2].publish(19_000)
        assert not views[0].elsewhere(budget=19_000)
        again = Occupancy(fd, 1)  # what an edge opens from the inherited descriptor
        assert again.total() == 57_000 and again.edges == 3
        again.close()
    finally:
        for view in views:
            view.close()
        os.close(fd)


def test_a_slot_outside_the_file_and_a_malformed_flag_are_errors() -> None:
    fd, views = Occupancy.create(2)
    try:
        with pytest.raises(ValueError, match="slot 2"):
            Occupancy(fd, 2)
    finally:
        for view in views:
            view.close()
        os.close(fd)
    assert parse_occupancy("7,1") == (7, 1)
    for bad in ("7", "a,1", "7,", "-1,2"):
        with pytest.raises(ValueError, match="FD,INDEX"):
            parse_occupancy(bad)
