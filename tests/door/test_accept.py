"""The accept loop with a ``Room`` (idled.door.accept), as the edges use it: real loopback sockets, real time.

At its limit a loop with a room stops accepting, so on a socket shared by several loops (edges under
``--workers``) a new connection goes to one with room; only when every room is full is a connection refused
(``busy``), after ``OVERFLOW_WAIT`` rather than never. Descriptor shortages: tests/faults/test_accept.py.
"""

from __future__ import annotations

import trio

from idled.door.accept import OVERFLOW_PATIENCE, OVERFLOW_WAIT, Shortage, accept_loop
from idled.server.roles.doorway import refuse, refuse_out_of_descriptors
from tests.peers import Client


class Limited:
    """A room of ``limit`` connections, each counted from its accept until its handler lets go of it."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.open = 0
        self.overflowed = 0
        self.others: list[Limited] = []  # what an edge reads from the shared occupancy

    def full(self) -> bool:
        return self.open >= self.limit

    def enter(self) -> None:
        self.open += 1

    def elsewhere(self) -> bool:
        return any(not other.full() for other in self.others)

    async def overflow(self, stream: trio.SocketStream) -> None:
        self.overflowed += 1
        await refuse(stream)

    async def hold(self, stream: trio.SocketStream) -> None:
        """Say which room serves it, then hold it until the client closes."""
        try:
            async with stream:
                await stream.send_all(self.name.encode())
                while await stream.receive_some(100):
                    pass
        finally:
            self.open -= 1


async def served_by(client: Client) -> str:
    """The name of the room serving ``client``, or the code of the error frame it was refused with."""
    with trio.fail_after(5):
        data = await client.stream.receive_some(100)
    if data.startswith(b"\x00"):  # a length prefix: an error frame
        client.decoder.receive_data(data)
        return str(client.decoder.next_event().code)
    return data.decode()


async def test_full_rooms_leave_connections_to_one_with_room_and_busy_only_when_all_are_full() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    small, big = Limited("small", 1), Limited("big", 3)
    shortage = Shortage(lambda: "unused")
    async with trio.open_nursery() as nursery:
        # Two loops on one socket, as edges sharing the public port: each with a descriptor of its own.
        for room, own in ((small, listener), (big, trio.SocketListener(listener.socket.dup()))):
            nursery.start_soon(accept_loop, own, room.hold, nursery, refuse_out_of_descriptors, shortage, room)
        clients = [await Client.connect(port) for _ in range(4)]
        # 1 + 3: the small room paused when full instead of refusing, and the big one took the rest.
        assert sorted([await served_by(client) for client in clients]) == ["big", "big", "big", "small"]
        assert await served_by(await Client.connect(port)) == "busy"  # every room full: refused, not left hanging
        assert small.overflowed + big.overflowed == 1
        await clients[0].stream.aclose()  # a slot frees up: a connection is served again
        with trio.fail_after(5):
            # (Right after an overflow, the other full loop may still be in its own OVERFLOW_WAIT to accept
            # the connection it waited for, and cannot tell a new arrival from it: it may refuse one more.)
            while (answer := await served_by(await Client.connect(port))) == "busy":
                await trio.sleep(OVERFLOW_WAIT)
        assert answer in ("small", "big")
        nursery.cancel_scope.cancel()


async def test_a_full_room_leaves_a_connection_to_another_with_room_that_is_slow_to_accept() -> None:
    """Under --workers the edges share their counts: a full edge does not refuse a connection that another edge
    (busy for a moment: a GC walk, a burst of logins) has room for; it refuses only past OVERFLOW_PATIENCE."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    full, slow = Limited("full", 0), Limited("slow", 1)
    full.others, slow.others = [slow], [full]
    shortage = Shortage(lambda: "unused")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_loop, listener, full.hold, nursery, refuse_out_of_descriptors, shortage, full)
        client = await Client.connect(port)
        await trio.sleep(OVERFLOW_PATIENCE / 2)  # the other edge is stalled this long, then accepts
        own = trio.SocketListener(listener.socket.dup())
        nursery.start_soon(accept_loop, own, slow.hold, nursery, refuse_out_of_descriptors, shortage, slow)
        assert await served_by(client) == "slow"
        assert full.overflowed == 0
        # Now every edge is full: refused, and at once (nobody has room to wait for).
        start = trio.current_time()
        assert await served_by(await Client.connect(port)) == "busy"
        assert trio.current_time() - start < OVERFLOW_PATIENCE / 2
        nursery.cancel_scope.cancel()
