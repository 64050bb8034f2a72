"""The demo's monitoring stage: check the stack's files, and read live figures through Prometheus.

Without targets it checks what ``docker compose up`` would load: ``promtool`` on the Prometheus
config, rules and rule tests, and a local Prometheus accepting every dashboard and rule query.
Given a training run folder and/or a server address that are still up (the trainer's
``telemetry.linger_seconds`` keeps its endpoint alive after training), it scrapes them with the
stack's rules and prints loader wait against compute and the server's per-stage latency, read
back through PromQL exactly as the Grafana panels read them.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from gpufeed.core import format_table
from gpufeed.obs import (
    PrometheusNotFoundError,
    check_queries,
    find_prometheus_binary,
    find_stack_dir,
    live_figures,
    load_queries,
    stack_prometheus,
)

__all__ = ["run_obs_demo"]


def _promtool_checks(stack: Path) -> list[list[str]]:
    """Rows (check, result, detail) of promtool on the stack's config, rules and rule tests.

    Raises:
        PrometheusNotFoundError: promtool is not installed.
        SystemExit: A check fails (promtool's output is in the message).
    """
    promtool = str(find_prometheus_binary("promtool"))
    prom_dir = stack / "prometheus"
    rules = sorted(str(p.relative_to(prom_dir)) for p in (prom_dir / "rules").glob("*.yml"))
    tests = sorted(str(p.relative_to(prom_dir)) for p in (prom_dir / "tests").glob("*.yml"))
    rows = []
    for what, args in (
        ("check config", ["check", "config", "prometheus.yml"]),
        ("check rules", ["check", "rules", *rules]),
        ("test rules", ["test", "rules", *tests]),
    ):
        proc = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=prom_dir, timeout=120)
        rows.append([f"promtool {what}", "ok" if proc.returncode == 0 else "FAILED", f"{len(args) - 2} file(s)"])
        if proc.returncode != 0:
            raise SystemExit(f"promtool {what} failed:\n{proc.stdout}{proc.stderr}")
    return rows


def run_obs_demo(
    out: str | Path,
    train_runs: Sequence[str | Path] = (),
    servers: Sequence[str] = (),
    scrape_seconds: float = 20.0,
) -> bool:
    """Print the monitoring stage of the demo; returns False when Prometheus is not installed.

    Args:
        out: The demo's run folder (Prometheus's files go under ``out/prometheus``).
        train_runs: Training run folders whose metrics endpoints are up.
        servers: ``host:port`` of running ``gpufeed serve`` instances.
        scrape_seconds: How long to scrape before reading figures.
    """
    stack = find_stack_dir()
    try:
        rows = _promtool_checks(stack)
        find_prometheus_binary()
    except PrometheusNotFoundError as err:
        print(f"skipping the monitoring checks: {err}")
        return False
    queries = load_queries(stack)
    targets = bool(train_runs or servers)
    with contextlib.ExitStack() as cleanup:
        # A check-only Prometheus keeps nothing worth looking at afterwards; a live one keeps its data.
        workdir = Path(out) / "prometheus" if targets else Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        prom = cleanup.enter_context(stack_prometheus(workdir, train_runs=train_runs, servers=servers, stack_dir=stack))
        jobs = [j for j, on in (("gpufeed-train", train_runs), ("gpufeed-server", servers)) if on]
        prom.api.wait_for_targets(jobs or ["prometheus"], timeout_s=60)
        start = time.time()
        time.sleep(scrape_seconds if targets else 2.0)
        values = None if targets else {"rank": ".*", "model": ".*"}
        checks = check_queries(prom.api, queries, start=start, end=time.time(), values=values)
        errors = [c for c in checks if c.status == "error"]
        rows.append(["PromQL of every panel and rule", "ok" if not errors else "FAILED", f"{len(checks)} queries"])
        if targets:
            with_data = sum(c.status == "ok" for c in checks)
            rows.append(["queries with live data", f"{with_data}/{len(checks)}", "GPU panels need dcgm-exporter"])
        print(format_table(["check", "result", "detail"], rows))
        if errors:
            raise SystemExit(
                "invalid PromQL in the stack:\n" + "\n".join(f"{c.query.label()}: {c.detail}" for c in errors)
            )
        if targets:
            print()
            print(format_table(["figure", "labels", "value"], live_figures(prom.api)))
    print("the stack with Grafana on a GPU host: docker compose -f docker/compose.yaml up --build (docs/monitoring.md)")
    return True
