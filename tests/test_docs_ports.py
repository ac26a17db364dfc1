"""The example ports of the docs never give one port to two different listeners.

A reader follows several tutorials on one machine: the API on ``--api-port 8080``, a webhook receiver for
``idled hook``, an edge beside its core. If two pages gave the same port to two different listeners (hook.md's
receiver and api.md's API were both on 8080), the second would not start while the first runs. So every
port the pages (README.md, docs/*.md) give a listener is collected with what listens there -- read from the
flag or the code that names it -- and the daemon's own defaults are added (``Config``: 7878 and 9878);
a port named for two different listeners fails the test with each place. Port 0 (pick a free one) is
not a port of anyone's. Local files only, well under a second.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from idled.ops.config import Config

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

CORE, CORE_METRICS, API = "a core's client port", "a core's metrics endpoint", "the HTTP API"
EDGE, EDGE_METRICS, RECEIVER, HOOK_METRICS = ("an edge's client port", "an edge's metrics endpoint",
                                              "a webhook receiver", "idled hook's metrics endpoint")
# (command, flag) -> the listener whose port the flag's value names (a port, or HOST:PORT[,HOST:PORT], or a URL).
FLAGS = {
    ("serve", "--port"): CORE, ("serve", "--metrics-port"): CORE_METRICS, ("serve", "--api-port"): API,
    ("serve", "--standby-of"): CORE, ("serve", "--advertise"): CORE,
    ("edge", "--port"): EDGE, ("edge", "--metrics-port"): EDGE_METRICS, ("edge", "--core"): CORE,
    ("hook", "--metrics-port"): HOOK_METRICS, ("hook", "--url"): RECEIVER,
    ("loadtest", "--target"): CORE, ("loadtest", "--metrics-port"): CORE_METRICS,
    ("status", "--metrics"): CORE_METRICS, ("promote", "--metrics"): CORE_METRICS,
    **{(command, flag): CORE for command in ("user", "watch", "query", "hook") for flag in ("--host", "--core")},
}
_COMMAND = re.compile(r"\bidled ([a-z][a-z-]*)((?:(?!\bidled )[^|;&`\n])*)")
_FLAG_VALUE = re.compile(r"(--[a-z-]+)[ =](\S+)")
_PORT_IN_VALUE = re.compile(r"^(\d+)$|:(\d+)(?:/|,|$)")
# Ports named outside a command line: a TOML setting, a URL of the API or of the metrics endpoint, code.
_ELSEWHERE = [
    (re.compile(r"^\s*api_port\s*=\s*(\d+)"), API),
    (re.compile(r"^\s*metrics_port\s*=\s*(\d+)"), CORE_METRICS),
    (re.compile(r"^\s*port\s*=\s*(\d+)"), CORE),
    (re.compile(r"https?://[\w.\[\]:-]+?:(\d+)/v1/"), API),
    (re.compile(r"[\w.\]]+:(\d+)/(?:metrics|status|healthz|readyz)\b"), CORE_METRICS),
    (re.compile(r"HTTPServer\(\(\"[^\"]*\", (\d+)\)"), RECEIVER),
    (re.compile(r"\b(?:open_session|open_gateway|open_observer|connect_\w+|watch|query)\(\"[^\"]+\", (\d+)"), CORE),
]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each numbered as its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        first, head = pending if pending is not None else (number, "")
        joined = head + line
        if joined.endswith("\\"):
            pending = (first, joined[:-1] + " ")
            continue
        out.append((first, joined))
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def listeners(text: str, where: str) -> list[tuple[int, str, str]]:
    """(port, listener, page:line) for every port ``text`` gives a listener."""
    found = []
    for number, line in _logical_lines(text):
        at = f"{where}:{number}"
        for command in _COMMAND.finditer(line):
            for flag, value in _FLAG_VALUE.findall(command.group(2)):
                if (service := FLAGS.get((command.group(1), flag))) is None:
                    continue
                for item in value.strip("'\"").split(","):
                    if match := _PORT_IN_VALUE.search(item):
                        found.append((int(match.group(1) or match.group(2)), service, at))
        for pattern, service in _ELSEWHERE:
            found.extend((int(port), service, at) for port in pattern.findall(line))
    return [entry for entry in found if entry[0] != 0]


def collisions(entries: list[tuple[int, str, str]]) -> list[str]:
    by_port: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for port, service, where in entries:
        by_port[port][service].append(where)
    return [f"port {port}: " + "; ".join(f"{service} ({', '.join(places[:3])})" for service, places in services.items())
            for port, services in sorted(by_port.items()) if len(services) > 1]


def test_no_example_port_serves_two_listeners() -> None:
    defaults = Config()
    entries = [(defaults.port, CORE, "idled.ops.config.Config"), (defaults.metrics_port, CORE_METRICS, "Config")]
    for page in PAGES:
        entries.extend(listeners(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT))))
    services = {service for _, service, _ in entries}
    assert {CORE, CORE_METRICS, API, RECEIVER, EDGE} <= services, "the scan misses listeners the pages name"
    assert collisions(entries) == []


def test_the_scan_reads_flags_urls_and_code() -> None:
    text = ("idled hook --host 127.0.0.1:7878 --url http://127.0.0.1:8080/presence --from 1 &\n"
            "$ curl -s http://127.0.0.1:8080/v1/stats | jq .\n"
            "idled edge --core 10.0.0.1:7878,10.0.0.2:7879 --port 0 \\\n  --metrics-port 9879\n"
            'HTTPServer(("127.0.0.1", 8090), Hook)\n')
    entries = listeners(text, "page.md")
    assert entries == [(7878, CORE, "page.md:1"), (8080, RECEIVER, "page.md:1"), (8080, API, "page.md:2"),
                       (7878, CORE, "page.md:3"), (7879, CORE, "page.md:3"), (9879, EDGE_METRICS, "page.md:3"),
                       (8090, RECEIVER, "page.md:5")]
    assert collisions(entries) == ["port 8080: a webhook receiver (page.md:1); the HTTP API (page.md:2)"]
