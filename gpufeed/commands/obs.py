"""``gpufeed obs ...``: the monitoring stack's helpers (scrape targets, a local Prometheus, query checks)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# Deferred imports: every gpufeed call imports this module to register its arguments, so a handler
# imports the libraries it runs (yaml, ssl, http) itself: `gpufeed --help` stays light.

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
    p.set_defaults(func=_targets)

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
    p.set_defaults(func=_prometheus)

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
    p.set_defaults(func=_verify)


def _targets(args: argparse.Namespace) -> int:
    import json

    from gpufeed.obs import MetricsAddressError, file_sd_groups, write_file_sd

    try:
        groups = file_sd_groups(args.run_dirs, host=args.host)
    except MetricsAddressError as err:
        print(f"gpufeed obs targets: error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_file_sd(args.out, groups)
        print(f"wrote {sum(len(g['targets']) for g in groups)} targets to {args.out}")
    else:
        print(json.dumps(groups, indent=2))
    return 0


def _prometheus(args: argparse.Namespace) -> int:
    from gpufeed.obs import run_local_prometheus

    return run_local_prometheus(
        args.workdir,
        train_runs=args.train,
        servers=args.server,
        dcgm=args.dcgm,
        interval=args.interval,
        stack_dir=args.stack,
    )


def _verify(args: argparse.Namespace) -> int:
    import time

    from gpufeed.obs import PrometheusAPI, PrometheusError, check_queries, find_stack_dir, format_checks, load_queries

    stack = args.stack or find_stack_dir()
    api = PrometheusAPI(args.prometheus)
    end = time.time()
    try:
        checks = check_queries(api, load_queries(stack), start=end - args.since, end=end, values=dict(args.values))
    except PrometheusError as err:
        print(f"gpufeed obs verify: error: {err}", file=sys.stderr)
        return 2
    failed = [c for c in checks if not c.passed]
    print(format_checks(checks, only_failures=not args.all))
    skipped = sum(c.status == "skipped" for c in checks)
    print(f"\n{len(checks) - len(failed) - skipped} passed, {skipped} skipped, {len(failed)} failed of {len(checks)}")
    return 1 if failed else 0
