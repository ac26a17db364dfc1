"""The machinery behind `idled loadtest` (the command itself, its coordinator, lives in `idled.tools.loadtest.run`).

- `ipc`      length-prefixed msgpack over the pipes between the coordinator and its worker processes.
- `worker`   a worker process: thousands of user connections, or gateway connections carrying many
             sessions, on its own trio loop (`python -m idled.tools.loadtest.worker`).
- `observer` the observer connection that streams presence events, and the fence probe.
- `target`   the server under test: spawning it, finding its pid, sampling CPU / RSS, scraping metrics.
- `report`   the JSON document, the text summary, the side-by-side comparison and the plot.

The pure parts (histogram, plan, matching) are in `idled.tools.loadtest.stats`.
"""
