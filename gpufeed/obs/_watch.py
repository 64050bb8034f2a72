"""A local Prometheus wired like the stack: the stack's job names and rules, local targets.

Used by ``gpufeed obs prometheus`` (watch a run without docker) and by the live tests. Training
ranks are found through their ``metrics-rank<r>.addr`` files and handed to Prometheus as a
file_sd list, rewritten as ranks appear; servers and dcgm-exporters are static targets.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpufeed.obs._prometheus import LocalPrometheus
from gpufeed.obs._targets import MetricsAddressError, file_sd_groups, read_metrics_addresses, write_file_sd
from gpufeed.obs._verify import find_stack_dir, stack_scrape_configs

__all__ = ["TRAIN_JOB", "refresh_train_targets", "run_local_prometheus", "stack_prometheus"]

log = logging.getLogger("gpufeed")

TRAIN_JOB, SERVER_JOB, DCGM_JOB = "gpufeed-train", "gpufeed-server", "dcgm"


def _train_sd_path(workdir: Path) -> Path:
    return workdir / "targets" / "train.json"


def refresh_train_targets(workdir: str | Path, train_runs: Sequence[str | Path], host: str = "127.0.0.1") -> int:
    """Rewrite the trainer target list from the runs' ``.addr`` files; returns the target count.

    Runs whose ranks have not written their address yet are left out until a later call.
    """
    ready = []
    for run in train_runs:
        try:
            if read_metrics_addresses(run):
                ready.append(run)
        except (FileNotFoundError, MetricsAddressError) as err:
            log.debug("training run %s not scrapable yet: %s", run, err)
    groups = file_sd_groups(ready, host=host) if ready else []
    write_file_sd(_train_sd_path(Path(workdir)), groups)
    return sum(len(g["targets"]) for g in groups)


def stack_prometheus(
    workdir: str | Path,
    *,
    train_runs: Sequence[str | Path] = (),
    servers: Sequence[str] = (),
    dcgm: Sequence[str] = (),
    interval: str = "1s",
    stack_dir: str | Path | None = None,
) -> LocalPrometheus:
    """A (not yet started) :class:`LocalPrometheus` with the stack's rules and job names.

    Args:
        workdir: Its config, TSDB, log and target list folder.
        train_runs: Training run folders (scraped through their ``metrics-rank<r>.addr`` files).
        servers: ``host:port`` of ``gpufeed serve`` instances.
        dcgm: ``host:port`` of dcgm-exporters.
        interval: Scrape and rule evaluation interval.
        stack_dir: The monitoring stack folder (default :func:`find_stack_dir`).
    """
    workdir = Path(workdir)
    stack = Path(stack_dir) if stack_dir else find_stack_dir()
    static = {job: list(addrs) for job, addrs in ((SERVER_JOB, servers), (DCGM_JOB, dcgm)) if addrs}
    configs = stack_scrape_configs(stack, static, interval)
    if train_runs:
        stack_scrape_configs(stack, {TRAIN_JOB: []})  # the job name must be the stack's
        refresh_train_targets(workdir, train_runs)
        configs.insert(
            0,
            {
                "job_name": TRAIN_JOB,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "file_sd_configs": [{"files": [str(_train_sd_path(workdir).resolve())], "refresh_interval": "2s"}],
            },
        )
    rules = sorted((stack / "prometheus" / "rules").glob("*.yml"))
    return LocalPrometheus(workdir, configs, rules, interval=interval)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, ``timeout``, a service manager) stops as Ctrl-C does: Prometheus with it.

    Python's default for SIGTERM ends the process without unwinding, and the Prometheus child lived on.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_local_prometheus(
    workdir: str | Path,
    *,
    train_runs: Sequence[str | Path] = (),
    servers: Sequence[str] = (),
    dcgm: Sequence[str] = (),
    interval: str = "5s",
    stack_dir: str | Path | None = None,
) -> int:
    """Run :func:`stack_prometheus` until interrupted, picking up new training ranks as they appear."""
    prom = stack_prometheus(
        workdir, train_runs=train_runs, servers=servers, dcgm=dcgm, interval=interval, stack_dir=stack_dir
    )
    with prom, _terminate_as_interrupt():
        print(f"prometheus: {prom.url}  (log: {prom.log_path})", flush=True)
        print(f"check the dashboards' queries with: gpufeed obs verify --prometheus {prom.url}", flush=True)
        known = -1
        try:
            while prom.process is not None and prom.process.poll() is None:
                if train_runs:
                    count = refresh_train_targets(workdir, train_runs)
                    if count != known:
                        print(f"training targets: {count}", flush=True)
                        known = count
                time.sleep(2)
        except KeyboardInterrupt:
            return 0
    print(f"prometheus exited; its log ends:\n{prom.log_tail()}")
    return 1
