"""Run an `idled` command with trio's clock running RATE times as fast as the wall clock.

    python -m tests.hook.fastclock RATE hook --url ...

trio takes its clock as an argument (``trio.run(..., clock=...)``); this passes it
``trio.testing.MockClock(rate=RATE)``, so every sleep, deadline and ``trio.current_time()`` in the process --
the retry backoff, the retry budget, the request and connect timeouts, the batch wait -- runs RATE times
faster, while ``time.time()`` (the signatures' timestamps, the events' ts) stays the wall's. An hour of the
hook's clock then passes in 3600/RATE real seconds against a real receiver, daemon and sockets.
"""

from __future__ import annotations

import sys
from typing import Any

import trio
from trio.testing import MockClock

from idled.cli import main as cli


def main() -> int:
    rate = float(sys.argv[1])
    real_run = trio.run

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("clock", MockClock(rate=rate))
        return real_run(*args, **kwargs)

    trio.run = run  # the command calls trio.run once, with no clock of its own
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
