"""CPU of reassembling one large frame fed in small pieces: WsDecoder (re-concatenates its partial frame on
every receive: quadratic) vs TCP's FrameDecoder (appends to a bytearray). Pure, no daemon. A gateway may send
frames up to max_gateway_frame (1 MiB default, 64 MiB max); before login the limit is 4 KiB."""
import sys
import time

sys.path.insert(0, "review")
from common import frame  # noqa: E402
from idled.protocol.framing import FrameDecoder  # noqa: E402
from idled.protocol.websocket import WsDecoder  # noqa: E402

import msgpack  # noqa: E402

for size in (64 << 10, 1 << 20):
    body = msgpack.packb({"op": "ping", "pad": b"x" * (size - 40)})
    for piece in (1448, 100):
        for name, dec, data in (("ws", WsDecoder(size + 64), frame(body, mask=b"\x00\x00\x00\x00")),
                                ("tcp", FrameDecoder(size + 64), len(body).to_bytes(4, "big") + body)):
            t0 = time.process_time()
            for i in range(0, len(data), piece):
                dec.receive_data(data[i:i + piece])
            dt = time.process_time() - t0  # (the frame is whole: what it says does not matter here)
            ev = dec.buffered
            print(f"{name:3} frame {size >> 10:5} KiB in {piece:4}-byte pieces ({len(data) // piece} reads): {dt*1000:8.1f} ms CPU (buffered {ev})")
