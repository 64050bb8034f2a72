"""The Deployment's container, run: its args, its probes, the autoscalers' queries in Prometheus, its drain.

``gpufeed serve`` starts with the args of docker/k8s/server.yaml, four of them changed for this
machine (the model repository, the loopback address, a free port, the CPU); a local Prometheus
scrapes it twice, under the target labels a cluster's Prometheus gives the Deployment's pod and the
InferenceService's predictor pod. With requests held in flight, the PromQL of keda.yaml and
kserve.yaml and prometheus-adapter's per-pod query (hpa.yaml's metric) each read their own pod's
series and nothing else, and give the mean of its samples. Then SIGTERM, as the kubelet sends it
after the preStop sleep: the readiness probe's route turns false while the liveness probe's stays
true, the held requests are answered, and the process exits 0 within gpufeed's longest drain.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from _k8s import container, one, parsed, predictor, queries, server_pods
from _serving import IMAGE_MODEL, encode, exported_repo

from gpufeed.obs import PrometheusNotFoundError, find_prometheus_binary
from gpufeed.obs._prometheus import LocalPrometheus
from gpufeed.server._launch import longest_drain_seconds

pytestmark = pytest.mark.live

HELD = 3  # requests held in the batcher: the model's batch sizes are 1, 2, 4; only 4 is kept
HOLD_SETTINGS = ["serve.batch_sizes=[4]", "serve.max_delay_ms=10000"]
POD = {"Deployment": "gpufeed-server-6d4cf56db6-8xk2p", "InferenceService": "gpufeed-predictor-5b7d9c8f4-q2w3e"}
SERVER = container(server_pods()["Deployment"])


def _args_for_this_machine(repo: Path) -> list[str]:
    """server.yaml's container args with the repository, address, port and device changed, the rest as written."""
    args = list(SERVER["args"])
    for flag, value in (("--model-repo", str(repo)), ("--host", "127.0.0.1"), ("--port", "0")):
        args[args.index(flag) + 1] = value
    args[args.index("device=gpu")] = "device=cpu"
    for setting in HOLD_SETTINGS:
        args += ["--set", setting]
    return args


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    # Output to a file, not a pipe: a pipe nobody reads could block the server.
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpufeed", *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text().splitlines():
            if "listening on http://" in line:
                return proc, line.split("listening on ")[1].split()[0]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"gpufeed serve did not start:\n{log.read_text()[-3000:]}")


def _probe(url: str, probe: str) -> int:
    """The status the kubelet's HTTP probe gets (200-399 passes)."""
    return httpx.get(url + SERVER[probe]["httpGet"]["path"], timeout=5).status_code


def _prometheus(workdir: Path, address: str) -> LocalPrometheus:
    """Scrapes the server twice, as the Deployment's pod and as the predictor's, with a cluster's target labels."""
    namespace = one("Namespace")["metadata"]["name"]
    jobs = [
        {
            "job_name": f"k8s-{kind.lower()}",
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [address], "labels": {"namespace": namespace, "pod": pod}}],
        }
        for kind, pod in POD.items()
    ]
    return LocalPrometheus(workdir, jobs, interval="1s")


def _mean_of_samples(prom: LocalPrometheus, pod: str, at: float) -> float:
    (series,) = prom.api.query(f'gpufeed_server_inflight_requests{{pod="{pod}"}}[2m]', at=at)
    values = [float(v) for _, v in series["values"]]
    return sum(values) / len(values)


def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _check_queries(prom: LocalPrometheus) -> None:
    """Each autoscaler's PromQL reads its own pod's series only, and gives the mean of its samples."""
    at, found = time.time(), queries()
    # A scrape that began before `at` may still be on its way in (a loaded machine: 2.0 against 1.5,
    # one sample more for the second query); a series' samples arrive in order, so once each pod has
    # one stamped after `at`, every query at `at` reads the same samples.
    for pod in POD.values():
        newest = f'timestamp(gpufeed_server_inflight_requests{{pod="{pod}"}}) > {at:.3f}'
        _until(lambda expr=newest: prom.api.query(expr), 30, f"no sample of {pod} after the chosen instant")
    matchers = f'namespace="{one("Namespace")["metadata"]["name"]}",pod=~"{POD["Deployment"]}"'
    # prometheus-adapter fills the template with the HPA's pods and groups by pod.
    adapter = found["adapter query"].replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")
    for where, expr, pod in (
        ("keda.yaml", found["keda.yaml"], POD["Deployment"]),
        ("kserve.yaml", found["kserve.yaml"], POD["InferenceService"]),
        ("prometheus-adapter", adapter, POD["Deployment"]),
    ):
        mean = _mean_of_samples(prom, pod, at)
        assert 0 < mean <= HELD, (where, mean)
        (series,) = prom.api.query(expr, at=at)
        assert float(series["value"][1]) == pytest.approx(mean), where
    assert len(prom.api.query(found["adapter series"], at=at)) == len(POD)  # the adapter sees both pods


@pytest.mark.timeout(300)
def test_the_deployments_container_probes_scales_and_drains_as_declared(tmp_path):
    try:
        find_prometheus_binary()
    except PrometheusNotFoundError as err:
        pytest.fail(str(err))
    args = _args_for_this_machine(exported_repo())
    _, cfg = parsed(args)
    log = tmp_path / "serve.log"
    proc, url = _start(args, log)
    image = encode(np.full((48, 64, 3), 128, dtype=np.uint8))
    try:
        _until(lambda: _probe(url, "startupProbe") == 200 or proc.poll() is not None, 120, "never ready")
        assert _probe(url, "readinessProbe") == _probe(url, "livenessProbe") == 200, log.read_text()
        with _prometheus(tmp_path / "prom", url.removeprefix("http://")) as prom, ThreadPoolExecutor(HELD) as pool:
            prom.api.wait_for_targets(["k8s-deployment", "k8s-inferenceservice"], timeout_s=60)
            predict = f"{url}/v1/models/{IMAGE_MODEL}/predict"
            held = [
                pool.submit(httpx.post, predict, content=image, headers={"content-type": "image/jpeg"}, timeout=60)
                for _ in range(HELD)
            ]
            inflight = f'gpufeed_server_inflight_requests{{pod="{POD["Deployment"]}"}}'
            seen = f"min_over_time({inflight}[2s]) == {HELD}"
            _until(lambda: prom.api.query(seen), 8, f"Prometheus never saw {HELD} requests in flight")
            _check_queries(prom)

            proc.send_signal(signal.SIGTERM)  # what the kubelet sends once the preStop sleep is over
            t_signal = time.monotonic()
            _until(lambda: _probe(url, "readinessProbe") == 400, 2, "readiness still true after SIGTERM")
            assert _probe(url, "livenessProbe") == 200, "liveness must hold during the drain"
            assert [f.result(timeout=60).status_code for f in held] == [200] * HELD
            status = proc.wait(timeout=longest_drain_seconds(cfg.serve) + 30)
            drained_s = time.monotonic() - t_signal
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 0, log.read_text()[-3000:]
    assert cfg.serve.shutdown_delay_seconds <= drained_s < longest_drain_seconds(cfg.serve)
    grace_s = server_pods()["Deployment"]["terminationGracePeriodSeconds"]
    assert drained_s < grace_s and predictor()["terminationGracePeriodSeconds"] == grace_s
