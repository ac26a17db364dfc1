"""The machinery behind `idled loadtest` (the command itself is `idled.cli.loadtest`).

- `scenario` what one run is (a frozen `Scenario`), and helpers for the server's own flags.
- `run`      the coordinator: one scenario against one server, in phases (observer, workers, measure, wind down).
- `state`    what the coordinator's tasks share: plan, matcher, samples, the time series.
- `results`  the result document, the targets and the verdict.
- `pool`     the worker processes, seen from the coordinator.
- `ipc`      length-prefixed msgpack over the pipes between the coordinator and its workers.
- `worker`   a worker process (`python -m idled.tools.loadtest.worker`): counters, reports, the process;
             `users` drives one connection per session, `gateways` a wheel of sessions per gateway
             connection; `connect` opens a connection and waits for the welcome.
- `observer` the observer connection that streams presence events, and the fence probe.
- `target`   the server under test: spawning it, finding its pid, sampling CPU / RSS, scraping metrics.
- `report`   the text summary, the side-by-side comparison, the sizing targets, the plot.
- `eventrate` event-to-subscriber latency at a steady event rate (`idled loadtest --event-rate`).
- `wire`     what user connections speak: idled's frames (`frames`; WebSocket too) or MQTT 3.1.1 (`mqtt`, sans-IO).
- `peer`     `idled loadtest --peer mqtt`: its windows, figures and table; `mosquitto` starts the broker it
             runs against.

The pure parts are `histogram` (log-linear histogram), `stats` (plan, matching, verdict), `mqtt` and `peer`.
"""
