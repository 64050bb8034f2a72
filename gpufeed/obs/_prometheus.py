"""A real Prometheus, run and queried from Python: the HTTP API client and a local server.

:class:`PrometheusAPI` talks to any Prometheus over its HTTP API (``/api/v1/...``).
:class:`LocalPrometheus` runs the ``prometheus`` binary on a free loopback port with a generated
scrape config and gpufeed's rule files, for tests and for watching a run without docker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "LocalPrometheus",
    "PrometheusAPI",
    "PrometheusError",
    "PrometheusNotFoundError",
    "find_prometheus_binary",
    "finite_values",
    "free_port",
]

log = logging.getLogger("gpufeed")

INSTALL_HINT = (
    "install Debian's prometheus package (as root: .ci/ensure-prometheus, or apt-get install -y "
    "--no-install-recommends prometheus), or set GPUFEED_PROMETHEUS_BIN to the folder holding the "
    "prometheus and promtool binaries"
)


class PrometheusError(RuntimeError):
    """Prometheus answered with an error (bad PromQL, unreachable, not ready in time)."""


class PrometheusNotFoundError(FileNotFoundError):
    """The ``prometheus`` or ``promtool`` binary is not installed."""


def find_prometheus_binary(name: str = "prometheus") -> Path:
    """Path of ``prometheus`` or ``promtool``: from ``$GPUFEED_PROMETHEUS_BIN``, else ``PATH``.

    Raises:
        PrometheusNotFoundError: Saying how to install it.
    """
    folder = os.environ.get("GPUFEED_PROMETHEUS_BIN")
    found = shutil.which(name, path=folder) if folder else shutil.which(name)
    if not found:
        where = f"in GPUFEED_PROMETHEUS_BIN={folder}" if folder else "on PATH"
        raise PrometheusNotFoundError(f"{name} is not installed ({where}): {INSTALL_HINT}")
    return Path(found)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def finite_values(result: Sequence[Mapping[str, Any]]) -> int:
    """How many finite sample values a vector or matrix result holds (NaN and +-Inf do not count)."""
    count = 0
    for series in result:
        values = series.get("values") or ([series["value"]] if "value" in series else [])
        count += sum(1 for _, v in values if math.isfinite(float(v)))
    return count


class PrometheusAPI:
    """A small client for Prometheus's HTTP API.

    Args:
        url: Base URL, e.g. ``http://127.0.0.1:9090``.
        timeout_s: Per-request timeout.
    """

    def __init__(self, url: str, timeout_s: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(
        self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None, post: bool = True
    ) -> Any:
        # Queries are POSTed as a form: long PromQL does not hit URL length limits (Grafana does the
        # same). Endpoints that only answer GET (targets, rules) take their parameters in the URL.
        encoded = urllib.parse.urlencode(params or {}, doseq=True)
        if post:
            request = urllib.request.Request(f"{self.url}{path}", data=encoded.encode())
        else:
            request = urllib.request.Request(f"{self.url}{path}" + (f"?{encoded}" if encoded else ""))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as err:
            try:
                payload = json.loads(err.read())
            except ValueError:
                raise PrometheusError(f"{self.url}{path}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError) as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {err}") from None
        if payload.get("status") != "success":
            raise PrometheusError(f"{payload.get('errorType', 'error')}: {payload.get('error', payload)}")
        return payload["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Evaluate ``expr`` at one instant; returns the result list (a scalar becomes one item)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._call("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        """Evaluate ``expr`` over ``[start, end]`` every ``step_s`` seconds (a matrix)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return self._call("/api/v1/query_range", params)["result"]

    def series(self, match: str, start: float | None = None) -> list[dict]:
        """Label sets of the series matching a selector."""
        params: list[tuple[str, Any]] = [("match[]", match)]
        if start is not None:
            params.append(("start", f"{start:.3f}"))
        return self._call("/api/v1/series", params)

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of ``label``, optionally only on series matching ``match`` (Grafana's label_values)."""
        if match is None:
            return sorted(self._call(f"/api/v1/label/{label}/values", post=False))
        return sorted({s[label] for s in self.series(match) if label in s})

    def targets(self) -> list[dict]:
        """The active scrape targets with their job, health and last error."""
        return self._call("/api/v1/targets", {"state": "active"}, post=False)["activeTargets"]

    def rule_groups(self) -> list[dict]:
        """Loaded rule groups with each rule's health and last error."""
        return self._call("/api/v1/rules", post=False)["groups"]

    def alerts(self) -> list[dict]:
        """Alerts that are pending or firing, with their labels and state."""
        return self._call("/api/v1/alerts", post=False)["alerts"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=self.timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_for_targets(self, jobs: Iterable[str], timeout_s: float = 60.0) -> None:
        """Block until every job has at least one target that was scraped successfully.

        Raises:
            PrometheusError: After ``timeout_s``, naming each job still down and its last error.
        """
        jobs = set(jobs)
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.targets()
            up = {t["labels"].get("job") for t in targets if t["health"] == "up"}
            if jobs <= up:
                return
            if time.monotonic() > deadline:
                details = [
                    f"{t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t.get('lastError') or ''}".strip()
                    for t in targets
                    if t["labels"].get("job") in jobs - up
                ]
                missing = sorted(jobs - up - {t["labels"].get("job") for t in targets})
                raise PrometheusError(
                    f"scrape targets not up after {timeout_s:.0f}s: {'; '.join(details) or 'none'}"
                    + (f"; jobs without targets: {', '.join(missing)}" if missing else "")
                )
            time.sleep(0.5)


def scrape_job(job: str, targets: Sequence[str], interval: str = "1s", metrics_path: str = "/metrics") -> dict:
    """One ``scrape_configs`` entry with static targets (``host:port`` strings)."""
    return {
        "job_name": job,
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": metrics_path,
        "static_configs": [{"targets": list(targets)}],
    }


class LocalPrometheus:
    """A ``prometheus`` process on a free loopback port, with its own config and storage.

    Use as a context manager; :attr:`api` queries it. Everything lives under ``workdir``.

    Args:
        workdir: Folder for the generated config, the TSDB and the log.
        scrape_configs: ``scrape_configs`` entries (see :func:`scrape_job`); a self-scrape job
            ``prometheus`` is added.
        rule_files: Rule files to load (evaluated every ``interval``).
        interval: Global scrape and rule evaluation interval (Prometheus duration).
        binary: The ``prometheus`` binary; default :func:`find_prometheus_binary`.
    """

    def __init__(
        self,
        workdir: str | Path,
        scrape_configs: Sequence[dict] = (),
        rule_files: Sequence[str | Path] = (),
        interval: str = "1s",
        binary: str | Path | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.scrape_configs = list(scrape_configs)
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.interval = interval
        self.binary = Path(binary) if binary else find_prometheus_binary()
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusError("this LocalPrometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> PrometheusAPI:
        return PrometheusAPI(self.url)

    def config(self) -> dict:
        """The generated prometheus.yml as a mapping."""
        jobs = [*self.scrape_configs, scrape_job("prometheus", [f"127.0.0.1:{self.port}"], self.interval)]
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": jobs,
        }

    def start(self, timeout_s: float = 60.0) -> LocalPrometheus:
        """Start the process and wait until it reports ready.

        Raises:
            PrometheusError: It exited or did not become ready; the message holds its log's tail.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # the free port can be taken between our probe and its bind
            self.port = free_port()
            config_path = self.workdir / "prometheus.yml"
            config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False), encoding="utf-8")
            with open(self.log_path, "wb") as logfile:
                self.process = subprocess.Popen(
                    [
                        str(self.binary),
                        f"--config.file={config_path}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--storage.tsdb.retention.time=1d",
                    ],
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                )
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                if self.api.ready():
                    log.info("prometheus %s ready on %s", self.binary, self.url)
                    return self
                time.sleep(0.2)
            tail = self.log_tail()
            self.stop()
            if "address already in use" in tail and attempt < 2:
                continue
            raise PrometheusError(f"prometheus did not become ready within {timeout_s:.0f}s; its log ends:\n{tail}")
        raise AssertionError("unreachable")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
