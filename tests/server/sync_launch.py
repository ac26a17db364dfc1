"""``python -m tests.server.sync_launch serve ...``: ``idled`` with the app.py lines that wire ``sync_standby``
applied from outside, for the tests of this branch until ``idled.server.app`` carries them itself (they are
described in the branch's hand-off). A no-op once it does: a ``Server`` that has its own ``replicas`` is left
alone."""

from __future__ import annotations

import sys
from typing import Any

from idled.cli.main import main
from idled.server import app
from idled.server.replication import Replicas

_recover = app.Server._recover
_status = app.Server.status


async def _wired_recover(self: Any) -> Any:
    recovery = await _recover(self)
    if getattr(self, "replicas", None) is None:
        self.replicas = Replicas(self.bus, self.log, sync=self.config.sync_standby, registry=self.metrics.registry)
        self._observers.replicas = self.replicas.run
    return recovery


def _wired_status(self: Any) -> dict[str, Any]:
    document = _status(self)
    document.setdefault("replication", self.replicas.status())
    return document


app.Server._recover = _wired_recover  # type: ignore[method-assign]
app.Server.status = _wired_status  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
