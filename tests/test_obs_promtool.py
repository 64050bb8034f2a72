"""promtool on the stack's Prometheus files: config and rules check, and the rule unit tests.

promtool is Prometheus's own checker; `.ci/ensure-prometheus` (run by `make test`) installs it.
Missing, these tests fail with how to install it: CI must never pass by skipping them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpufeed.obs import PrometheusNotFoundError, find_prometheus_binary

pytestmark = pytest.mark.process

PROMETHEUS_DIR = Path(__file__).resolve().parents[1] / "gpufeed" / "obs" / "stack" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        return find_prometheus_binary("promtool")
    except PrometheusNotFoundError as err:
        pytest.fail(str(err))


def _run(promtool: Path, *args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_check_config(promtool):
    proc = _run(promtool, "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_check_rules(promtool):
    files = sorted(p.name for p in (PROMETHEUS_DIR / "rules").glob("*.yml"))
    proc = _run(promtool, "check", "rules", *files, cwd=PROMETHEUS_DIR / "rules")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(files)


def test_promtool_test_rules(promtool):
    tests = sorted(str(p.relative_to(PROMETHEUS_DIR)) for p in (PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert len(tests) >= 3
    proc = _run(promtool, "test", "rules", *tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(tests)


@pytest.mark.parametrize(
    ("rule_file", "original", "broken"),
    [
        ("training.yml", "ratio_rate1m > 0.2", "ratio_rate1m > 0.05"),  # would also fire for the 10% rank
        ("serving.yml", "error_ratio:rate5m > 0.05", "error_ratio:rate5m > 0.5"),  # would miss 10% 5xx
        ("targets.yml", 'job=~"gpufeed-server|dcgm"', 'job=~"gpufeed-server|dcgm|gpufeed-train"'),
    ],
)
def test_rule_tests_catch_a_wrong_threshold(promtool, tmp_path, rule_file, original, broken):
    # The unit tests are only worth something if they fail when a rule is wrong.
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy)
    path = copy / "rules" / rule_file
    text = path.read_text()
    assert original in text
    path.write_text(text.replace(original, broken))
    test_file = f"tests/{rule_file.removesuffix('.yml')}_test.yml"
    proc = _run(promtool, "test", "rules", test_file, cwd=copy)
    assert proc.returncode != 0, f"the rule tests did not notice {broken!r}:\n{proc.stdout}"
    assert "FAILED" in proc.stdout + proc.stderr
