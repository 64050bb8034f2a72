"""Evaluate every dashboard and rule query of the stack against a real Prometheus.

A query passes when Prometheus accepts it and it returned at least one finite sample over the
checked time range. Alerts are checked twice: the whole expression must evaluate, and its
signal (the part compared with the threshold, see :func:`alert_signal`) must have data, since a
healthy system makes the alert expression itself empty. Queries on dcgm-exporter's GPU metrics
are only required to have data when a ``dcgm`` scrape target is up: on a host without an NVIDIA
GPU they are checked for validity and reported as skipped, never fed made-up numbers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from gpufeed.core import format_table
from gpufeed.obs._contract import exported_series_names
from gpufeed.obs._prometheus import PrometheusAPI, PrometheusError, finite_values, scrape_job
from gpufeed.obs._queries import DEFAULT_GRAFANA_VALUES, Query, alert_signal, label_values_args, substitute

__all__ = [
    "QueryCheck",
    "check_queries",
    "dcgm_scraped",
    "find_stack_dir",
    "format_checks",
    "missing_series",
    "packaged_stack_dir",
    "rule_health_problems",
    "stack_scrape_configs",
    "variable_values",
]

Status = Literal["ok", "error", "no_data", "skipped"]

NO_GPU_REASON = "valid PromQL; data not required: no dcgm-exporter target is up (no NVIDIA GPU with DCGM here)"


@dataclass(frozen=True)
class QueryCheck:
    """The outcome for one query: ``ok``, ``error``, ``no_data`` or ``skipped`` (with the reason)."""

    query: Query
    expr: str
    status: Status
    detail: str

    @property
    def passed(self) -> bool:
        return self.status in ("ok", "skipped")


def packaged_stack_dir() -> Path:
    """The monitoring stack shipped inside the package (``gpufeed/obs/stack``).

    It holds ``prometheus/`` (prometheus.yml, rules, rule tests) and ``grafana/`` (dashboards,
    provisioning): the same files ``docker/compose.yaml`` mounts, installed as package data.
    """
    return Path(str(resources.files("gpufeed.obs").joinpath("stack")))


def find_stack_dir() -> Path:
    """The monitoring stack folder: ``$GPUFEED_STACK_DIR`` when set, else :func:`packaged_stack_dir`.

    Raises:
        FileNotFoundError: The folder lacks ``prometheus/prometheus.yml``, naming where it looked.
    """
    env = os.environ.get("GPUFEED_STACK_DIR")
    stack = Path(env) if env else packaged_stack_dir()
    if not (stack / "prometheus" / "prometheus.yml").is_file():
        where = f"GPUFEED_STACK_DIR={env}" if env else f"the installed package ({stack})"
        raise FileNotFoundError(
            f"cannot find the monitoring stack in {where}: expected prometheus/prometheus.yml, prometheus/rules/ "
            "and grafana/dashboards/ under it"
            + ("" if env else "; the gpufeed installation is incomplete, reinstall it")
        )
    return stack


def stack_scrape_configs(
    stack_dir: str | Path, targets: Mapping[str, Sequence[str]], interval: str = "1s"
) -> list[dict]:
    """The stack's scrape jobs (from its prometheus.yml) pointed at the given ``host:port`` targets.

    Job names, metrics paths and the like come from the stack's own config, so rules that name
    jobs (``GpufeedTargetDown``) are checked against the same names the stack uses.

    Raises:
        KeyError: A job in ``targets`` is not one of the stack's jobs (naming the known ones).
    """
    import yaml

    config = yaml.safe_load((Path(stack_dir) / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    out = []
    for name, addresses in targets.items():
        if name not in jobs:
            raise KeyError(f"scrape job {name!r} is not in the stack's prometheus.yml; known: {', '.join(jobs)}")
        out.append(scrape_job(name, addresses, interval, jobs[name].get("metrics_path", "/metrics")))
    return out


def dcgm_scraped(api: PrometheusAPI) -> bool:
    """Whether a dcgm-exporter target (job ``dcgm``) is being scraped successfully."""
    return bool(api.query('up{job="dcgm"} == 1'))


def variable_values(api: PrometheusAPI, queries: Iterable[Query]) -> dict[str, str]:
    """A concrete value for each dashboard variable: the first value its label_values() finds.

    Grafana would offer these same values in the variable's drop-down; picking one (rather than
    "All" = ``.*``) checks that the panels' selectors really match the variable's values.
    """
    values = {}
    for query in queries:
        if query.kind != "variable":
            continue
        metric, label = label_values_args(query.expr)
        found = api.label_values(label, metric)
        if found:
            values[query.where] = found[0]
    return values


def _range_check(api: PrometheusAPI, query: Query, expr: str, start: float, end: float, step_s: float, gpu: bool):
    try:
        result = api.query_range(expr, start, end, step_s)
    except PrometheusError as err:
        return "error", str(err)
    if query.needs_gpu and not gpu:
        return "skipped", NO_GPU_REASON
    finite = finite_values(result)
    if finite:
        return "ok", f"{len(result)} series, {finite} finite samples"
    if result:
        return "no_data", f"{len(result)} series but only NaN/Inf values over the checked range"
    return "no_data", "no series over the checked range"


def check_queries(
    api: PrometheusAPI,
    queries: Sequence[Query],
    start: float,
    end: float,
    step_s: float = 2.0,
    values: Mapping[str, str] | None = None,
    gpu: bool | None = None,
) -> list[QueryCheck]:
    """Evaluate each query over ``[start, end]``; see the module docstring for what passes.

    Args:
        api: The Prometheus to ask.
        queries: From :func:`gpufeed.obs.load_queries`.
        start, end: Unix times bounding the range checked for data.
        step_s: Range query resolution.
        values: Grafana variable values; defaults are :data:`DEFAULT_GRAFANA_VALUES` plus the
            first value of each dashboard variable (:func:`variable_values`).
        gpu: Whether GPU metrics must have data; default: whether a dcgm target is up.
    """
    gpu = dcgm_scraped(api) if gpu is None else gpu
    filled = {**DEFAULT_GRAFANA_VALUES, **variable_values(api, queries), **(values or {})}
    checks = []
    for query in queries:
        if query.kind == "variable":
            try:
                metric, label = label_values_args(query.expr)
                found = api.label_values(label, metric)
            except (ValueError, PrometheusError) as err:
                checks.append(QueryCheck(query, query.expr, "error", str(err)))
                continue
            status: Status = "ok" if found else "no_data"
            detail = f"values: {', '.join(found)}" if found else "no values"
            checks.append(QueryCheck(query, query.expr, status, detail))
            continue
        try:
            expr = substitute(query.expr, filled)
        except KeyError as err:
            checks.append(QueryCheck(query, query.expr, "error", str(err.args[0])))
            continue
        if query.kind == "alert":
            signal = alert_signal(expr)
            try:
                api.query(expr, at=end)
            except PrometheusError as err:
                checks.append(QueryCheck(query, expr, "error", str(err)))
                continue
            if signal is None:
                checks.append(QueryCheck(query, expr, "error", "an alert must read '<signal> <comparison> <number>'"))
                continue
            status, detail = _range_check(api, query, signal, start, end, step_s, gpu)
            checks.append(QueryCheck(query, signal, status, f"signal: {detail}"))
            continue
        status, detail = _range_check(api, query, expr, start, end, step_s, gpu)
        checks.append(QueryCheck(query, expr, status, detail))
    return checks


def rule_health_problems(api: PrometheusAPI) -> list[str]:
    """Rules Prometheus reports unhealthy or with an evaluation error (empty when all are fine)."""
    problems = []
    for group in api.rule_groups():
        for rule in group["rules"]:
            if rule.get("health") not in ("ok", "unknown") or rule.get("lastError"):
                problems.append(f"{group['name']}/{rule['name']}: {rule.get('health')} {rule.get('lastError', '')}")
    return problems


def missing_series(api: PrometheusAPI, component: str | None = None) -> list[str]:
    """Contracted sample names (see :data:`gpufeed.obs.METRICS`) that Prometheus has no series of."""
    present = {
        s["metric"]["__name__"] for s in api.query('count by (__name__) ({__name__=~"gpufeed_.+"})') if s["metric"]
    }
    return sorted(exported_series_names(component) - present)


def format_checks(checks: Sequence[QueryCheck], only_failures: bool = False) -> str:
    """A readable table of query checks."""
    rows = [
        [c.status, c.query.source, c.query.kind, c.query.where[:60], c.detail[:100]]
        for c in checks
        if not (only_failures and c.passed)
    ]
    return format_table(["status", "file", "kind", "panel / rule", "detail"], rows)
