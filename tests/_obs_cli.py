"""``gpufeed obs prometheus`` as a user runs it: started, read until it says where it listens, then Ctrl-C (test helper)."""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpufeed.obs import PrometheusAPI


@contextlib.contextmanager
def obs_prometheus(
    cmd: Sequence[str | Path], train_run: Path, stop: int = signal.SIGINT, **popen
) -> Iterator[PrometheusAPI]:
    """Run ``cmd`` (an ``obs prometheus --train train_run`` command) until the block ends, then stop it.

    Prometheus's own endpoint stands in for the run's rank 0, so the train target is up once the
    block starts. On leaving, the command gets ``stop`` (SIGINT: Ctrl-C; SIGTERM: ``kill``) and
    must exit 0 within 90 s (Prometheus flushes its storage on the way out: at most 20 s,
    LocalPrometheus.stop), its Prometheus gone with it.
    """
    # Ctrl-C's default in the child whatever this process ignores: a job a non-interactive shell
    # starts in the background (a CI runner's, say) ignores SIGINT, and its children inherit that.
    restore_ctrl_c = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=restore_ctrl_c,
        **popen,
    )
    try:
        assert proc.stdout is not None
        seen, match = [], None
        for line in proc.stdout:  # log lines come first; the URL line says where it listens
            seen.append(line)
            match = re.match(r"prometheus: (http://127\.0\.0\.1:(\d+))", line)
            if match:
                break
        assert match, "".join(seen)
        (train_run / "metrics-rank0.addr").write_text(f"127.0.0.1:{match.group(2)}\n")
        api = PrometheusAPI(match.group(1))
        api.wait_for_targets(["gpufeed-train"], timeout_s=60)
        yield api
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(
                f"gpufeed obs prometheus did not exit 90 s after signal {stop}: {proc.communicate()[0]}"
            ) from None
    assert proc.returncode == 0, f"gpufeed obs prometheus exited {proc.returncode}"
    with socket.socket() as probe:  # its Prometheus no longer listens (SIGTERM left it running)
        assert probe.connect_ex(("127.0.0.1", int(match.group(2)))) != 0, "Prometheus outlived gpufeed obs prometheus"
