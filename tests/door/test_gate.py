"""The gate: a share per source of the connections not logged in yet (real loopback sockets, a real Server).

Sources are addresses; an IPv6 source counts as its /64; behind a balancer speaking PROXY, the source is the
client's address from the header, and the balancer's own connections are not counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from idled.door.addresses import address_key
from idled.protocol import ErrorCode, Login, Welcome
from idled.protocol.proxy import encode_v2
from tests.peers import Client, running


@pytest.mark.parametrize(("host", "key"), [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),  # a dual-stack listener's IPv4 peer
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    (None, None),  # a unix socket's peer: this machine's own processes, not counted
])
def test_whose_share_a_peer_counts_against(host: str | None, key: str | None) -> None:
    assert address_key(host) == key


async def connect(port: int, source: str = "127.0.0.1") -> Client:
    return Client(await trio.open_tcp_stream("127.0.0.1", port, local_address=source), recv_timeout=10.0)


async def test_one_address_gets_its_share_of_logins_in_progress_and_no_more(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, max_pending_per_address=2, login_timeout=30.0) as h:
        silent = [await connect(h.port), await connect(h.port)]
        await trio.sleep(0.2)  # both are in the gate
        third = await connect(h.port)
        error = await third.expect_error(ErrorCode.BUSY)
        assert "more than 2 connections from 127.0.0.1" in error.reason
        assert h.metric("idled_frames_rejected_total", reason="per_address") == 1
        other = await connect(h.port, source="127.0.0.2")  # another address is not affected
        await other.send(Login("uid", "alice"))
        assert isinstance(await other.recv(), Welcome)
        # A connection that logs in gives its share back: the address may begin another login.
        await silent[0].send(Login("uid", "bob"))
        assert isinstance(await silent[0].recv(), Welcome)
        fourth = await connect(h.port)
        await fourth.send(Login("uid", "carol"))
        assert isinstance(await fourth.recv(), Welcome)
        # ... and so does one that leaves.
        await silent[1].stream.aclose()
        await trio.sleep(0.2)
        fifth, sixth = await connect(h.port), await connect(h.port)
        await sixth.send(Login("uid", "dave"))
        assert isinstance(await sixth.recv(), Welcome)
        await fifth.stream.aclose()


async def test_behind_a_balancer_the_share_is_the_clients_from_the_proxy_header(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, max_pending_per_address=2, login_timeout=30.0, proxy_protocol=True,
                       proxy_allow="127.0.0.1/32") as h:

        async def via_balancer(source: str) -> Client:
            client = await connect(h.port)  # every connection comes from the balancer's one address
            target = "2001:db8::100" if ":" in source else "192.0.2.1"
            await client.send_raw(encode_v2((source, 4444), (target, 7878)))
            return client

        held = [await via_balancer("203.0.113.9"), await via_balancer("203.0.113.9")]
        held += [await via_balancer("2001:db8::1"), await via_balancer("2001:db8::2")]  # one /64: its share is full
        await trio.sleep(0.2)
        over = await via_balancer("203.0.113.9")
        assert "from 203.0.113.9" in (await over.expect_error(ErrorCode.BUSY)).reason
        over6 = await via_balancer("2001:db8::3")
        assert "from 2001:db8::/64" in (await over6.expect_error(ErrorCode.BUSY)).reason
        # The balancer's own address is not a source: others behind it still log in.
        for source in ("203.0.113.10", "2001:db8:0:1::1"):
            client = await via_balancer(source)
            await client.send(Login("uid", source))
            assert isinstance(await client.recv(), Welcome)
        for client in held:
            await client.stream.aclose()
