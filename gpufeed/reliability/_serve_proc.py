"""``gpufeed serve`` as a child process, for the reliability scripts and their tests.

The server runs exactly as an operator runs it (its own process, its own signal handling), on a
free loopback port: ``--port 0``, and the bound address is read from the line it prints. Its
output goes to files, not pipes, so a chatty server can never block on a full pipe while a load
test runs. Memory is read from ``/proc/<pid>/status`` (VmRSS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from gpufeed.core import module_argv

__all__ = ["ServeProcess", "rss_bytes"]


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


class ServeProcess:
    """A ``gpufeed serve --model MODEL_DIR --port 0`` (or ``--model-repo DIR``) child process.

    Args:
        model_dir: The model folder to serve, or a repository of them.
        overrides: ``--set key=value`` strings (``serve.queue_capacity=8``).
        env: Extra environment variables (``GPUFEED_SERVE_TOKEN``).
        device: ``cpu``, ``gpu`` or ``auto`` (``--set device=...``).

    Usage::

        with ServeProcess(model_dir, ["serve.queue_capacity=8"]) as server:
            httpx.get(server.url + "/v2/health/ready")
    """

    def __init__(
        self, model_dir: Path, overrides: Iterable[str] = (), env: dict[str, str] | None = None, device: str = "cpu"
    ) -> None:
        self.model_dir = Path(model_dir)
        self.overrides = [f"device={device}", *overrides]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._dir = tempfile.TemporaryDirectory(prefix="gpufeed-serve-proc-")
        self.stdout_path = Path(self._dir.name) / "stdout.txt"
        self.stderr_path = Path(self._dir.name) / "stderr.txt"
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.host, self.port = "127.0.0.1", 0

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise RuntimeError("gpufeed serve has not been started: call start() or use the context manager")
        return self.proc

    @property
    def pid(self) -> int:
        return self._started().pid

    @property
    def exit_status(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal), else None."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        """Whether the server process was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, ready_timeout: float = 180.0) -> ServeProcess:
        """Start the server and wait until ``/v2/health/ready`` answers 200."""
        import httpx

        where = "--model" if (self.model_dir / "model_card.json").is_file() else "--model-repo"
        cmd = module_argv("gpufeed", "serve", where, str(self.model_dir), "--port", "0")
        for item in self.overrides:
            cmd += ["--set", item]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            proc = self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=self.env, start_new_session=True)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gpufeed serve exited with status {proc.returncode}: {self.log()[-2000:]}")
            if not self.url:
                text = self.stdout_path.read_text(errors="replace")
                if "listening on " in text:
                    self.url = text.split("listening on ", 1)[1].split()[0]
                    self.host, port = self.url.removeprefix("http://").rsplit(":", 1)
                    self.port = int(port)
            if self.url:
                try:
                    if httpx.get(self.url + "/v2/health/ready", timeout=2).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"gpufeed serve was not ready within {ready_timeout:g} s: {self.log()[-2000:]}")

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def log(self) -> str:
        """Everything the server wrote to stderr (its log) so far."""
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        self._started().send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit status (negative: killed by that signal); raises subprocess.TimeoutExpired."""
        return self._started().wait(timeout=timeout)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for the drain; SIGKILL if it does not end. Returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self._started().wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()
            self._dir.cleanup()
