"""``gpufeed obs ...``: the monitoring stack's helpers (scrape targets, a local Prometheus, query checks)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# libraries they run (yaml, ssl, http), are in _obs_handlers.py.

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")


def _duration_s(text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 15m, 2h or 1d, got {text!r}")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as 127.0.0.1:8000, got {text!r}")
    return text


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE such as model=resnet18, got {text!r}")
    return key, value


def register(sub: argparse._SubParsersAction) -> None:
    obs = sub.add_parser("obs", help="monitoring: scrape targets, a local Prometheus, dashboard query checks")
    cmds = obs.add_subparsers(dest="obs", metavar="ACTION", required=True)

    p = cmds.add_parser(
        "targets",
        help="write a Prometheus file_sd target list from training runs' metrics-rank<r>.addr files",
        description="Each training rank writes the host:port of its metrics endpoint to "
        "RUN_DIR/metrics-rank<r>.addr. This turns them into a file_sd JSON list Prometheus re-reads on change "
        "(the stack's prometheus.yml reads targets/train*.json; docker/compose.yaml mounts docker/prometheus-targets there).",
    )
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="training run folders")
    p.add_argument("--out", type=Path, help="JSON file to write (default: print)")
    p.add_argument("--host", default="127.0.0.1", help="host to use for wildcard bind addresses (default 127.0.0.1)")
    p.set_defaults(func="gpufeed.commands._obs_handlers:targets")

    p = cmds.add_parser(
        "prometheus",
        help="run a local Prometheus with gpufeed's rules against a training run and/or a server",
        description="Starts the prometheus binary on a free loopback port with the stack's rule files and "
        "scrape jobs pointed at the given trainer run folders (ranks are picked up as their .addr files appear), "
        "servers and dcgm-exporters. Runs until interrupted.",
    )
    p.add_argument("--train", type=Path, action="append", default=[], metavar="RUN_DIR", help="training run folder")
    p.add_argument("--server", type=_address, action="append", default=[], metavar="HOST:PORT", help="gpufeed serve")
    p.add_argument("--dcgm", type=_address, action="append", default=[], metavar="HOST:PORT", help="dcgm-exporter")
    p.add_argument("--workdir", type=Path, default=Path("runs/prometheus"), help="config, data and log folder")
    p.add_argument("--interval", default="5s", help="scrape and rule evaluation interval (default 5s)")
    p.add_argument("--stack", type=Path, help="monitoring stack folder (default: the installed gpufeed/obs/stack)")
    p.set_defaults(func="gpufeed.commands._obs_handlers:prometheus")

    p = cmds.add_parser(
        "verify",
        help="evaluate every dashboard panel and rule query against a Prometheus; list any that fail",
        description="Each query must be accepted and return finite data over the last --since. Alerts are checked "
        "by their signal (the part compared with the threshold). GPU (dcgm) queries need data only when a dcgm "
        "target is up. Exit status 1 when any query errors or returns no data.",
    )
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL (default the stack's)")
    p.add_argument("--since", type=_duration_s, default=_duration_s("15m"), help="range checked (default 15m)")
    p.add_argument(
        "--set",
        dest="values",
        type=_assignment,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Grafana variable's value (default: the first value its query finds)",
    )
    p.add_argument("--all", action="store_true", help="list passing queries too")
    p.add_argument("--stack", type=Path, help="monitoring stack folder (default: the installed gpufeed/obs/stack)")
    p.set_defaults(func="gpufeed.commands._obs_handlers:verify")
