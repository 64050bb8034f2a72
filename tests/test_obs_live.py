"""Every dashboard panel and every rule, evaluated by a real Prometheus scraping a live trainer and server.

The stack (tests/_live_stack.py) runs ``gpufeed train`` on the synthetic data, exports a
checkpoint and runs ``gpufeed serve`` on it, sends good and bad requests, and lets a real
Prometheus with the stack's rules scrape both. Then each panel query (Grafana variables filled
in: ``$__rate_interval`` = 20s, ``$__interval`` = 5s, ``$__range`` = 5m, ``$rank``/``$model`` =
the first value their own label_values() query finds) and each rule must evaluate without
error and return finite data over the run. Alerts are checked by their signal (the part
compared with the threshold).

GPU panels read dcgm-exporter's metrics, which only exist on NVIDIA hosts running it: they are
checked for validity always, and for data only when ``GPUFEED_DCGM_ADDRESS`` names a running
dcgm-exporter (otherwise that test is skipped, saying so). No GPU numbers are made up.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from _live_stack import DCGM_ENV, FOREIGN_MODEL, MODEL_NAME, missing_commands, start_live_stack, stop_live_stack

from gpufeed.obs import PrometheusNotFoundError, check_queries, find_prometheus_binary, load_queries
from gpufeed.obs._contract import ERROR_REASONS, PROTOCOLS, STAGES
from gpufeed.obs._verify import format_checks, missing_series, rule_health_problems

STACK = Path(__file__).resolve().parents[1] / "gpufeed" / "obs" / "stack"

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def live(tmp_path_factory, synth_dir):
    missing = missing_commands()
    if missing:
        pytest.fail(f"the live stack needs `gpufeed {' / '.join(missing)}`, which this checkout does not have")
    try:
        find_prometheus_binary()
    except PrometheusNotFoundError as err:
        pytest.fail(str(err))
    try:
        stack = start_live_stack(tmp_path_factory.mktemp("live"), synth_dir, STACK)
    except RuntimeError as err:
        pytest.fail(f"could not start the live stack: {err}")
    try:
        yield stack
    finally:
        stop_live_stack(stack)


@pytest.fixture(scope="module")
def checks(live):
    """Query checks once data has accumulated (re-run until all pass or 150 s have gone by)."""
    queries = load_queries(STACK)
    deadline = time.monotonic() + 150
    time.sleep(25)  # a few scrapes and rule evaluations with moving counters
    while True:
        result = check_queries(live.api, queries, start=live.started, end=time.time())
        if all(c.passed for c in result) or time.monotonic() > deadline:
            return result
        time.sleep(5)


def test_traffic_got_its_answers(live, checks):
    counts = live.traffic.counts
    for kind in ("rest_jpeg", "rest_png", "kserve_bytes"):
        assert counts[(kind, 200)] > 0, f"no successful {kind} request: {dict(counts)}\n{live.logs()}"
    for kind, code in (("unknown_model", 404), ("unsupported_media_type", 415)):
        assert counts[(kind, code)] > 0, f"{kind} was not answered {code}: {dict(counts)}"
    for kind in ("corrupt_image", "malformed_request"):
        codes = {c for (k, c) in counts if k == kind}
        assert codes and all(400 <= c < 500 for c in codes), f"{kind} answered {codes}"


def test_every_contracted_metric_is_exported(live, checks):
    missing = missing_series(live.api)
    assert not missing, f"contracted series nothing exports: {missing}\n{live.logs()}"


def test_rules_evaluate_without_errors(live, checks):
    assert rule_health_problems(live.api) == []


def test_every_panel_and_rule_returns_data(live, checks):
    failed = [c for c in checks if not c.query.needs_gpu and not c.passed]
    assert not failed, f"queries that errored or returned no data:\n{format_checks(failed)}\n{live.logs()}"
    assert sum(c.status == "ok" for c in checks) >= 60


def test_gpu_panels(live, checks):
    gpu = [c for c in checks if c.query.needs_gpu]
    assert gpu, "the dashboards have GPU and decoder utilisation panels"
    errors = [c for c in gpu if c.status == "error"]
    assert not errors, format_checks(errors)
    if all(c.status == "skipped" for c in gpu):
        pytest.skip(f"GPU panels are valid PromQL; data not checked: {DCGM_ENV} names no dcgm-exporter to scrape")
    assert all(c.status == "ok" for c in gpu), format_checks(gpu)


def test_label_values_stay_bounded(live, checks):
    api = live.api
    server = '{__name__=~"gpufeed_server_.+"}'
    assert set(api.label_values("model", server)) <= {MODEL_NAME, "unknown"}
    assert FOREIGN_MODEL not in api.label_values("model")
    assert set(api.label_values("stage", server)) <= set(STAGES)
    assert set(api.label_values("protocol", server)) <= set(PROTOCOLS)
    assert set(api.label_values("reason", server)) <= set(ERROR_REASONS)
    assert all(re.fullmatch(r"[1-5]\d\d", code) for code in api.label_values("code", server))
    ranks = api.label_values("rank", '{__name__=~"gpufeed_train_.+"}')
    assert ranks == ["0"]


def test_errors_are_counted_by_reason(live, checks):
    found = {
        (s["metric"]["model"], s["metric"]["reason"])
        for s in live.api.query("sum by (model, reason) (gpufeed_server_errors_total) > 0")
    }
    expected = {
        ("unknown", "unknown_model"),
        (MODEL_NAME, "unsupported_media_type"),
        (MODEL_NAME, "corrupt_image"),
        (MODEL_NAME, "malformed_request"),
    }
    assert expected <= found, f"error counters by (model, reason): {sorted(found)}"


def test_demo_figures_read_through_promql(live, checks):
    from gpufeed.obs import live_figures

    rows = live_figures(live.api)
    shares = [value for title, labels, value in rows if title == "loader-bound share" and labels == "rank=0"]
    assert shares and shares[0].endswith("%"), rows
    stages = {labels.split("stage=")[1] for title, labels, _ in rows if title == "server stage p50"}
    assert stages == set(STAGES), rows
