"""Load, overload and shutdown of a real `gpufeed serve` process (the scripts behind `gpufeed bench soak`,
`bench overload` and `bench drain`, with the same pass/fail rules). The 60 s soak is marked slow; a short
one runs by default. Run with -s to see the figures."""

from __future__ import annotations

import pytest
from _serving import IMAGE_MODEL, exported_repo

from gpufeed.bench.drain import run_drain
from gpufeed.bench.loader import make_bench_images
from gpufeed.bench.overload import run_overload
from gpufeed.bench.soak import run_soak

# Checks that hold a time target: benches print and judge them; tests leave them to the bench.
TIMED_CHECKS = {"live while large bodies are refused"}

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[bytes]:
    folder = make_bench_images(tmp_path_factory.mktemp("photos"), 16, 320, 240)
    return [p.read_bytes() for p in sorted((folder / "photos").glob("*.jpg"))]


def _soak(images, seconds: float, warmup_s: float) -> dict:
    report = run_soak(
        exported_repo() / IMAGE_MODEL, images, clients=64, seconds=seconds, warmup_s=warmup_s,
        overrides=("serve.warmup_batches=1",), progress=False,
    )  # fmt: skip
    print(report.table())
    assert report.ok, report.problems()
    result = report.figures
    assert result["load"]["ok"] > 0 and result["load"]["statuses"] == {"200": result["load"]["ok"]}
    assert result["clients"] == 64 and result["load"]["p99_ms"] >= result["load"]["p50_ms"] > 0
    return result


def test_soak_short_64_clients(images):
    """The CI version of the soak: same clients, same rules, a few seconds."""
    _soak(images, seconds=6.0, warmup_s=4.0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_soak_64_clients_for_60_seconds(images):
    result = _soak(images, seconds=60.0, warmup_s=10.0)
    assert result["load"]["ok"] > 1000


def test_overload_is_refused_cleanly(images):
    report = run_overload(
        exported_repo() / IMAGE_MODEL, images, clients=64, seconds=4.0, warmup_s=1.0, queue_capacity=8,
        request_timeout_s=5.0, overrides=("serve.warmup_batches=1",),
    )  # fmt: skip
    print(report.table())
    assert report.ok, report.problems()
    result = report.figures
    assert result["queue_depth_samples"] > 0 and result["load"]["reasons"] == {"queue_full": result["load"]["errors"]}
    assert (
        result["counted_errors"]["queue_full"] >= result["load"]["errors"] and result["counted_errors"]["internal"] == 0
    )


def test_sigterm_drains_and_exits_zero(images):
    report = run_drain(exported_repo() / IMAGE_MODEL, images, hold_ms=1500.0, shutdown_delay_s=1.5)
    print(report.table())
    assert report.ok, report.problems()
    result = report.figures
    assert result["inflight_sent"] == 3 and result["inflight_answered_correctly"] == 3
    assert result["statuses"].get("503", 0) >= 2 and result["dropped"] == 0 and result["exit_status"] == 0


def test_bench_commands_print_figures_and_exit_by_the_verdict(tmp_path):
    """`gpufeed bench fuzz` and `bench drain` end to end: the commands behind the README's figures."""
    import json
    import subprocess
    import sys

    model = str(exported_repo() / IMAGE_MODEL)
    for name in ("fuzz", "drain"):
        out = tmp_path / f"{name}.json"
        done = subprocess.run(
            [sys.executable, "-m", "gpufeed", "bench", name, "--model-dir", model, "--cache", str(tmp_path),
             "--json", str(out)] + (["--hold-ms", "1000", "--shutdown-delay", "1"] if name == "drain" else []),
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
        figures = json.loads(out.read_text())
        # The exit status and the last line follow the bench's own verdict, which includes a time target
        # (liveness under 100 ms): that figure is printed and judged by the bench, not by this test, so a
        # loaded machine cannot fail it. Every other check must pass.
        assert done.returncode == (0 if figures["ok"] else 1), done.stdout[-3000:] + done.stderr[-3000:]
        last_line = done.stdout.rstrip().splitlines()[-1].strip()
        assert last_line.startswith("result: PASS" if figures["ok"] else "result: FAIL"), last_line
        untimed = {check: passed for check, passed in figures["checks"].items() if check not in TIMED_CHECKS}
        assert untimed and all(untimed.values()), untimed
        if name == "fuzz":
            assert figures["requests"] >= 1000 and not figures["failures"] and figures["exit_status"] == 0
            live = figures["liveness"]
            assert live["bodies_answered"] and live["under_load"]["probes"], live
        else:
            assert figures["exit_status"] == 0 and figures["dropped"] == 0
