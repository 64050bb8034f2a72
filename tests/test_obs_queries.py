"""Query handling (variables, alert signals, metric names) and training-run scrape targets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpufeed.obs import MetricsAddressError, file_sd_groups
from gpufeed.obs._queries import alert_signal, label_values_args, metric_names, substitute
from gpufeed.obs._targets import read_metrics_addresses


def test_substitute_grafana_variables():
    expr = 'rate(x{rank=~"$rank", m="${model}", k="[[kind]]"}[$__rate_interval])'
    out = substitute(expr, {"rank": "0", "model": "m1", "kind": "a", "__rate_interval": "20s"})
    assert out == 'rate(x{rank=~"0", m="m1", k="a"}[20s])'
    with pytest.raises(KeyError, match=r"\$rank.*known: __rate_interval"):
        substitute(expr, {"__rate_interval": "20s"})


@pytest.mark.parametrize(
    ("expr", "signal"),
    [
        ("rank:x:ratio_rate1m > 0.2", "rank:x:ratio_rate1m"),
        ('up{job=~"a|b"} == 0', 'up{job=~"a|b"}'),
        ("max by (model) (ready) < 1", "max by (model) (ready)"),
        ('m{stage="queue_wait"} >= 1.5e-1', 'm{stage="queue_wait"}'),
        ("a / b\n  > 5", "a / b"),
        ("rate(x[5m])", None),
        ("a > b", None),
    ],
)
def test_alert_signal(expr, signal):
    assert alert_signal(expr) == signal


def test_metric_names():
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(gpufeed_server_stage_seconds_bucket{model=~"$model",'
        ' stage="queue_wait"}[$__rate_interval]))) / on (model) group_left model:x:rate5m offset 5m or up == bool 1'
    )
    assert metric_names(expr) == {"gpufeed_server_stage_seconds_bucket", "model:x:rate5m", "up"}


def test_label_values_args():
    assert label_values_args("label_values(gpufeed_train_steps_total, rank)") == ("gpufeed_train_steps_total", "rank")
    assert label_values_args("label_values(rank)") == (None, "rank")
    with pytest.raises(ValueError, match="unsupported template variable query"):
        label_values_args("query_result(up)")


def test_metrics_addresses_to_file_sd(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics-rank0.addr").write_text("127.0.0.1:9400\n")
    (run / "metrics-rank1.addr").write_text("0.0.0.0:9401")
    (run / "metrics-rank10.addr").write_text("[::]:9410")
    (run / "steps.jsonl").write_text("{}")
    assert read_metrics_addresses(run) == {0: ("127.0.0.1", 9400), 1: ("0.0.0.0", 9401), 10: ("[::]", 9410)}
    (group,) = file_sd_groups([run], host="trainer")
    assert group["targets"] == ["127.0.0.1:9400", "trainer:9401", "trainer:9410"]


def test_bad_metrics_address_names_the_file(tmp_path):
    (tmp_path / "metrics-rank0.addr").write_text("localhost")
    with pytest.raises(MetricsAddressError, match=r"metrics-rank0\.addr: expected 'host:port'.*'localhost'"):
        read_metrics_addresses(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MetricsAddressError, match=r"has no metrics-rank<r>\.addr file"):
        file_sd_groups([empty])


@pytest.mark.process
def test_cli_obs_targets(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics-rank0.addr").write_text("127.0.0.1:9400\n")
    out = tmp_path / "targets" / "train.json"
    cmd = [sys.executable, "-m", "gpufeed", "obs", "targets", str(run), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == [{"targets": ["127.0.0.1:9400"], "labels": {}}]
    (run / "metrics-rank0.addr").write_text("nonsense")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "expected 'host:port'" in proc.stderr and "Traceback" not in proc.stderr
