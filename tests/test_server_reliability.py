"""Load, overload, shutdown and a small fuzz corpus against a real `gpufeed serve` process (the runs behind
`gpufeed reliability soak|overload|drain|fuzz`, with the same pass/fail rules). The 60 s soak is marked slow;
a short one runs by default. Run with -s to see the figures."""

from __future__ import annotations

import pytest
from _serving import IMAGE_MODEL, exported_repo

from gpufeed.reliability import run_drain, run_fuzz, run_overload, run_soak
from gpufeed.synth._photos import make_bench_images

# Checks that hold a time target: the commands print and judge them; tests leave them to the commands.
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
    # The probes run for 70 % of the shutdown delay, the listener closes at 100 %. With 1.5 s, on a machine at
    # load 10 (two pytest workers beside other jobs) the first probe came 0.9 s after the signal: one 503, and one
    # prediction sent inside the window that connected after the listener closed. 3 s leaves 2.1 s and 0.9 s.
    # The held requests wait 5 s for a full batch: with 1.5 s, at that load they were answered before the
    # harness's scrapes saw them in flight, and the signal came with none in flight.
    report = run_drain(exported_repo() / IMAGE_MODEL, images, hold_ms=5000.0, shutdown_delay_s=3.0)
    print(report.table())
    assert report.ok, report.problems()
    result = report.figures
    assert result["inflight_sent"] == 3 and result["inflight_answered_correctly"] == 3
    assert result["statuses"].get("503", 0) >= 2 and result["dropped"] == 0 and result["exit_status"] == 0


def test_fuzz_judges_a_small_corpus_then_liveness(images):
    """`gpufeed reliability fuzz`'s run on two corpus categories: every answer judged, the server's exit and
    liveness added (the whole corpus is tests/test_server_fuzz.py's)."""
    report = run_fuzz(
        exported_repo() / IMAGE_MODEL, images, categories=("truncated_png", "zero_bytes"),
        overrides=("serve.warmup_batches=1",), progress=False,
    )  # fmt: skip
    print(report.table())
    figures = report.to_dict()
    assert set(figures["categories"]) == {"truncated_png", "zero_bytes"} and figures["requests"] > 50
    assert not figures["failures"] and figures["exit_status"] == 0 and figures["server_alive_after"]
    live = figures["liveness"]
    assert live["bodies_answered"] and live["under_load"]["probes"], live
    # The liveness check holds a time target: judged by the command, not by this test (a loaded machine).
    untimed = {check: passed for check, passed in figures["checks"].items() if check not in TIMED_CHECKS}
    assert {"exit status 0 on SIGTERM", "live while large bodies are refused"} <= set(figures["checks"])
    assert all(untimed.values()), untimed


def test_fuzz_refuses_an_unknown_category_naming_the_known_ones(images):
    with pytest.raises(
        ValueError, match=r"unknown fuzz categories \['truncated_gif'\]; the corpus has \[.*'zero_bytes'"
    ):
        run_fuzz(exported_repo() / IMAGE_MODEL, images, categories=("truncated_gif",))


def test_old_bench_names_run_the_reliability_command_with_a_notice(tmp_path, capsys):
    """`gpufeed bench drain` still runs `gpufeed reliability drain` (here refusing a folder without a model,
    before any work), after one line naming the new command; `bench --help` does not list it."""
    from gpufeed.cli import main

    for argv in (["bench", "drain"], ["reliability", "drain"]):
        assert main([*argv, "--model-dir", str(tmp_path / "none"), "--cache", str(tmp_path / "cache")]) == 2
        err = capsys.readouterr().err.splitlines()
        notice = ["gpufeed bench drain: renamed 'gpufeed reliability drain'; the old name goes in the next release"]
        assert err[:-1] == (notice if argv[0] == "bench" else []), err
        assert err[-1].startswith(f"gpufeed {argv[0]}: error: ") and str(tmp_path / "none") in err[-1], err
    assert not (tmp_path / "cache").exists(), "the command started work before checking the model"
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    listing = capsys.readouterr().out
    assert "loader" in listing and "train" in listing
    assert not {"soak", "overload", "drain", "fuzz"} & set(listing.split()), listing
