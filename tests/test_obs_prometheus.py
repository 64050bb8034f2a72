"""The Prometheus harness against a real ``prometheus`` binary, with nothing gpufeed to scrape.

These run on every branch: Prometheus scrapes itself, loads the stack's rules, and accepts every
dashboard and rule expression (the real PromQL parser and evaluator, not a regex). A training
target found through a ``metrics-rank<r>.addr`` file is scraped via file_sd, a dead server
target turns GpufeedTargetDown pending, and the checker reports queries without data as such.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _obs_cli import obs_prometheus

from gpufeed.obs import (
    PrometheusNotFoundError,
    Query,
    check_queries,
    find_prometheus_binary,
    load_queries,
)
from gpufeed.obs._prometheus import free_port
from gpufeed.obs._verify import rule_health_problems
from gpufeed.obs._watch import refresh_train_targets, stack_prometheus

pytestmark = pytest.mark.live

STACK = Path(__file__).resolve().parents[1] / "gpufeed" / "obs" / "stack"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """A local Prometheus with the stack's rules; a training run folder and a dead server as targets."""
    try:
        find_prometheus_binary()
    except PrometheusNotFoundError as err:
        pytest.fail(str(err))
    work = tmp_path_factory.mktemp("prom")
    run = work / "train-run"
    run.mkdir()
    dead_server = f"127.0.0.1:{free_port()}"  # nothing listens there
    instance = stack_prometheus(work / "prometheus", train_runs=[run], servers=[dead_server], stack_dir=STACK)
    with instance:
        yield instance, run


@pytest.mark.timeout(120)
def test_rules_load_and_evaluate_cleanly(prom):
    prom, _ = prom
    groups = prom.api.rule_groups()
    names = {g["name"] for g in groups}
    assert {"gpufeed-train-recording", "gpufeed-train-alerts", "gpufeed-server-recording"} <= names
    rule_count = sum(len(g["rules"]) for g in groups)
    assert rule_count == sum(1 for q in load_queries(STACK) if q.kind in ("record", "alert"))
    deadline = time.monotonic() + 30
    while any(r.get("health") == "unknown" for g in prom.api.rule_groups() for r in g["rules"]):
        assert time.monotonic() < deadline, "rules were never evaluated"
        time.sleep(0.5)
    assert rule_health_problems(prom.api) == []


@pytest.mark.timeout(120)
def test_every_stack_query_is_valid_promql(prom):
    prom, _ = prom
    # No trainer or server here, so "no data" is expected; what must not happen is an error.
    queries = load_queries(STACK)
    now = time.time()
    checks = check_queries(prom.api, queries, start=now - 30, end=now, values={"rank": ".*", "model": ".*"})
    errors = [f"{c.query.label()}: {c.detail}" for c in checks if c.status == "error"]
    assert not errors, "\n".join(errors)
    assert len(checks) == len(queries)
    # Without data the checker says so instead of passing: it can fail.
    serving = [c for c in checks if c.query.source == "serving.json" and not c.query.needs_gpu]
    assert serving and all(c.status == "no_data" for c in serving), [c.status for c in serving]


@pytest.mark.timeout(60)
def test_checker_reports_bad_promql(prom):
    prom, _ = prom
    bad = Query("inline", "broken panel", "A", "sum(rate(gpufeed_train_steps_total[1m])", "panel")
    (check,) = check_queries(prom.api, [bad], start=time.time() - 10, end=time.time(), values={})
    assert check.status == "error" and "parse error" in check.detail


@pytest.mark.timeout(120)
def test_training_ranks_are_scraped_through_their_addr_files(prom):
    prom, run = prom
    # A rank's endpoint appears after Prometheus started: its .addr file is picked up via file_sd.
    # Prometheus's own /metrics stands in for the endpoint (a real Prometheus exposition).
    (run / "metrics-rank0.addr").write_text(f"127.0.0.1:{prom.port}\n")
    assert refresh_train_targets(prom.workdir, [run]) == 1
    prom.api.wait_for_targets(["gpufeed-train"], timeout_s=60)
    (target,) = [t for t in prom.api.targets() if t["labels"]["job"] == "gpufeed-train"]
    assert target["scrapeUrl"] == f"http://127.0.0.1:{prom.port}/metrics"


@pytest.mark.timeout(120)
def test_dead_server_makes_target_down_alert_pending(prom):
    prom, _ = prom
    deadline = time.monotonic() + 60
    while True:
        alerts = prom.api.alerts()
        down = [a for a in alerts if a["labels"]["alertname"] == "GpufeedTargetDown"]
        if down:
            break
        assert time.monotonic() < deadline, "GpufeedTargetDown never became pending for the dead server"
        time.sleep(0.5)
    assert down[0]["labels"]["job"] == "gpufeed-server" and down[0]["state"] == "pending"  # for: 2m


@pytest.mark.timeout(120)
def test_demo_stage_checks_the_stack(tmp_path, capsys):
    from gpufeed.demo import run_obs_demo

    assert run_obs_demo(tmp_path) is True
    out = capsys.readouterr().out
    for line in (
        "promtool check config",
        "promtool check rules",
        "promtool test rules",
        "PromQL of every panel and rule",
    ):
        assert re.search(rf"{line}\s+ok", out), out
    assert "FAILED" not in out


def _gpufeed(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_cli_verify_lists_queries_without_data(prom):
    prom, _ = prom
    proc = _gpufeed("obs", "verify", "--prometheus", prom.url, "--since", "1m", "--stack", str(STACK))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing gpufeed is scraped here
    assert "no_data" in proc.stdout and "Per-stage latency p99 (stacked)" in proc.stdout
    assert re.search(r"\d+ passed, \d+ skipped, \d+ failed of 85", proc.stdout)
    proc = _gpufeed("obs", "verify", "--prometheus", f"http://127.0.0.1:{free_port()}", "--stack", str(STACK))
    assert proc.returncode == 2 and "cannot reach Prometheus" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_cli_prometheus_scrapes_a_training_run(tmp_path, stop):
    run = tmp_path / "run"
    run.mkdir()
    cmd = [sys.executable, "-m", "gpufeed", "obs", "prometheus", "--train", str(run), "--interval", "1s"]
    cmd += ["--workdir", str(tmp_path / "prom"), "--stack", str(STACK)]
    with obs_prometheus(cmd, run, stop=stop):
        pass  # the train target came up; leaving stops it, which must exit 0 and take Prometheus down
