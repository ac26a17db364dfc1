"""Generates idled-dashboard.json (run: python deploy/grafana/generate_dashboard.py).

Edit this file, not the JSON: tests/deploy/test_deploy.py checks the JSON is this script's output, that every
series it queries is one idled exports, and that every query parses as PromQL.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).with_name("idled-dashboard.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job="$job", instance=~"$instance"'
panels: list[dict[str, Any]] = []
_ids = itertools.count(1)


def row(title: str, y: int) -> None:
    pid = next(_ids)
    panels.append({"id": pid, "type": "row", "title": title, "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})


def ts(
    title: str, targets: list[tuple[str, str]], x: int, y: int, w: int = 8, h: int = 8, unit: str = "short", desc: str = ""
) -> None:
    pid = next(_ids)
    p = {"id": pid, "type": "timeseries", "title": title, "description": desc, "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": x, "y": y},
         "fieldConfig": {"defaults": {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                               "showPoints": "never", "spanNulls": False}},
                         "overrides": []},
         "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                     "tooltip": {"mode": "multi", "sort": "desc"}},
         "targets": [{"datasource": DS, "refId": chr(65 + i), "expr": e, "legendFormat": l, "range": True}
                     for i, (e, l) in enumerate(targets)]}
    panels.append(p)


def stat(
    title: str, expr: str, x: int, y: int, w: int = 4, h: int = 4, unit: str = "short", legend: str = "",
    instant_text: bool = False, desc: str = "",
) -> None:
    pid = next(_ids)
    panels.append({"id": pid, "type": "stat", "title": title, "description": desc, "datasource": DS,
                   "gridPos": {"h": h, "w": w, "x": x, "y": y},
                   "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                   "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                               "colorMode": "value", "graphMode": "none" if instant_text else "area",
                               "textMode": "name" if instant_text else "auto"},
                   "targets": [{"datasource": DS, "refId": "A", "expr": expr, "legendFormat": legend,
                                "instant": instant_text, "range": not instant_text}]})


def q(metric: str, p: float, extra: str = "") -> str:
    return f'histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{SEL}{extra}}}[$__rate_interval])))'


# --- layout: rows of panels, 24 grid units wide ---
y = 0
row("Overview", y); y += 1
stat("Up", f'up{{{SEL}}}', 0, y, legend="{{instance}}")
stat("Version", f'idled_info{{{SEL}}}', 4, y, legend="{{version}}", instant_text=True)
stat("Sessions online", f'sum(idled_sessions_online{{{SEL}}})', 8, y)
stat("Connections", f'sum(idled_connections{{{SEL}}})', 12, y)
stat("FD usage", f'max(process_open_fds{{{SEL}}} / process_max_fds{{{SEL}}})', 16, y, unit="percentunit")
stat("Tick", f'max(idled_tick_seconds{{{SEL}}})', 20, y, unit="s")
y += 4
row("Presence", y); y += 1
ts("Connections by role", [(f'sum by (role) (idled_connections{{{SEL}}})', "{{role}}")], 0, y,
   desc="Open client connections; pending = accepted, login not yet completed.")
ts("Sessions online", [(f'sum(idled_sessions_online{{{SEL}}})', "online")], 8, y)
ts("Presence events", [(f'sum by (kind, reason) (rate(idled_presence_events_total{{{SEL}}}[$__rate_interval]))', "{{kind}} / {{reason}}")],
   16, y, unit="ops")
y += 8
ts("Offline lateness", [(q("idled_offline_lateness_seconds", 0.5), "p50"), (q("idled_offline_lateness_seconds", 0.99), "p99"),
                         (f'max(idled_tick_seconds{{{SEL}}})', "one tick (limit)")], 0, y, unit="s",
   desc="Offline time minus deadline. Contract: never early, at most one tick late.")
ts("Logins", [(f'sum by (role, result) (rate(idled_logins_total{{{SEL}}}[$__rate_interval]))', "{{role}} {{result}}")], 8, y, unit="ops")
ts("Frames rejected", [(f'sum by (reason) (rate(idled_frames_rejected_total{{{SEL}}}[$__rate_interval]))', "{{reason}}")], 16, y, unit="ops")
y += 8
row("Detector", y); y += 1
ts("Detector keys", [(f'sum(idled_detector_keys{{{SEL}}})', "keys"), (f'sum(idled_detector_overflow_keys{{{SEL}}})', "in overflow wheel")], 0, y)
ts("Tick duration", [(q("idled_tick_duration_seconds", 0.5), "p50"), (q("idled_tick_duration_seconds", 0.99), "p99")], 8, y, unit="s")
ts("Ticks processed", [(f'sum(rate(idled_detector_ticks_total{{{SEL}}}[$__rate_interval]))', "ticks/s")], 16, y, unit="ops",
   desc="The tick task sleeps until the next due slot, so this is below 1/tick when nothing is due.")
y += 8
row("Event loop", y); y += 1
ts("Event-loop lag", [(q("idled_event_loop_lag_seconds", 0.5), "p50"), (q("idled_event_loop_lag_seconds", 0.99), "p99"),
                      (f'max(idled_event_loop_stall_max_seconds{{{SEL}}})', "largest since start")], 0, y, w=12, unit="s")
ts("Stalls over 1 s", [(f'sum(increase(idled_event_loop_lag_seconds_count{{{SEL}}}[$__rate_interval])) - '
                        f'sum(increase(idled_event_loop_lag_seconds_bucket{{{SEL}, le=~"1(\\\\.0)?"}}[$__rate_interval]))', "stalls")],
   12, y, w=12)
y += 8
row("Event log", y); y += 1
ts("Records appended", [(f'sum(rate(idled_eventlog_records_total{{{SEL}}}[$__rate_interval]))', "records/s")], 0, y, unit="ops")
ts("Bytes appended", [(f'sum(rate(idled_eventlog_bytes_total{{{SEL}}}[$__rate_interval]))', "bytes/s")], 8, y, unit="Bps")
ts("fsync duration", [(q("idled_eventlog_fsync_duration_seconds", 0.5), "p50"), (q("idled_eventlog_fsync_duration_seconds", 0.99), "p99")],
   16, y, unit="s")
y += 8
ts("Degraded (disk full)", [(f'idled_eventlog_degraded{{{SEL}}}', "{{instance}}")], 0, y, w=12,
   desc="1 while the event log cannot be written (a full disk): logins and attaches that would bring a user online, and kicks, are refused (unavailable).")
ts("Events held in memory", [(f'idled_eventlog_held_events{{{SEL}}}', "{{instance}}")], 12, y, w=12,
   desc="Events not yet written to the event log: they wait in memory, in seq order, while the disk is full.")
y += 8
row("Process", y); y += 1
ts("Resident memory", [(f'process_resident_memory_bytes{{{SEL}}}', "{{instance}}")], 0, y, unit="bytes")
ts("CPU", [(f'rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval])', "{{instance}}")], 8, y, unit="percentunit",
   desc="Cores used (1.0 = one full core).")
ts("File descriptors", [(f'process_open_fds{{{SEL}}}', "open"), (f'process_max_fds{{{SEL}}}', "limit")], 16, y)
y += 8
ts("Wall clock ahead of the system's", [(f'idled_wall_clock_ahead_seconds{{{SEL}}}', "{{instance}}")], 0, y, w=12,
   unit="s", desc="After a step back of the system clock, idled's wall clock (event ts, token expiry) does not go "
                  "back: it slews towards the system's; meanwhile tokens live shorter by this gap.")


dash = {
    "__inputs": [], "annotations": {"list": []}, "editable": True, "graphTooltip": 1,
    "description": "idled: connection-idle (presence) detector. Metrics from idled/ops/metrics.py.",
    "links": [], "panels": panels, "refresh": "30s", "schemaVersion": 39, "style": "dark",
    "tags": ["idled"], "time": {"from": "now-6h", "to": "now"}, "timezone": "",
    "title": "idled", "uid": "idled-overview", "version": 1,
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "job", "label": "Job", "type": "query", "datasource": DS,
         "query": {"query": "label_values(idled_info, job)", "refId": "job"}, "definition": "label_values(idled_info, job)",
         "current": {"text": "idled", "value": "idled"}, "refresh": 1, "hide": 0, "sort": 1, "options": []},
        {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
         "query": {"query": 'label_values(idled_info{job="$job"}, instance)', "refId": "instance"},
         "definition": 'label_values(idled_info{job="$job"}, instance)',
         "includeAll": True, "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
         "refresh": 2, "hide": 0, "sort": 1, "options": []},
    ]},
}




def render() -> str:
    return json.dumps(dash, indent=2) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
