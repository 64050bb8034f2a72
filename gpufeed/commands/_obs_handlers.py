"""The handlers of ``gpufeed obs ...`` (their arguments are registered by ``obs.py``).

Imported only when one of them runs. The obs commands run without DALI and onnxruntime
(``cli.WITHOUT_STACK``): nothing here loads them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpufeed.obs import (
    MetricsAddressError,
    PrometheusAPI,
    PrometheusError,
    check_queries,
    file_sd_groups,
    find_stack_dir,
    format_checks,
    load_queries,
    run_local_prometheus,
    write_file_sd,
)

__all__ = ["prometheus", "targets", "verify"]


def targets(args: argparse.Namespace) -> int:
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


def prometheus(args: argparse.Namespace) -> int:
    return run_local_prometheus(
        args.workdir,
        train_runs=args.train,
        servers=args.server,
        dcgm=args.dcgm,
        interval=args.interval,
        stack_dir=args.stack,
    )


def verify(args: argparse.Namespace) -> int:
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
