"""The Kubernetes manifests of docker/k8s: valid against the schemas of named releases, and true to the server.

Schemas: the core objects (Deployment, Service, HorizontalPodAutoscaler ...) against
kubernetes-validate's schemas of the releases in ``K8S_RELEASES``; KServe's InferenceService and
KEDA's ScaledObject against their CRDs' OpenAPI schemas vendored in docker/k8s/schemas (release in
each file's header). Both strictly: an unknown field is refused, as ``kubectl apply`` refuses it
with strict field validation. What no schema knows is checked against gpufeed itself: the
container args parse with gpufeed's own argument parser and config, the probes ask routes the
server's app answers, the autoscalers' queries read a gauge the server's registry exports with
labels it has, and the termination grace period outlasts the preStop sleep plus gpufeed's
longest drain. tests/test_k8s_live.py runs the Deployment's container against Prometheus.
"""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from _k8s import DOCS, K8S, ROOT, container, one, parsed, predictor, queries, server_pods
from starlette.routing import Match

from gpufeed import __version__
from gpufeed.config import ServeConfig
from gpufeed.obs._contract import metric_by_name
from gpufeed.obs._queries import metric_names
from gpufeed.server import _app
from gpufeed.server._launch import longest_drain_seconds
from gpufeed.server._metrics import ServerMetrics

DOCKERFILE = ROOT / "docker" / "server.Dockerfile"
# Strict schemas of kubernetes-validate 1.37.0 (pyproject's test extra): 1.30, the first release
# whose preStop `sleep` action is on by default (1.28's schema has no `sleep`: see below), and 1.37,
# the newest that package knows.
K8S_RELEASES = ("1.30.0", "1.37.0")
CRD_SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): K8S / "schemas" / "kserve-inferenceservice.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): K8S / "schemas" / "keda-scaledobject.yaml",
}
# Labels Prometheus attaches to a pod's series when it scrapes it in a cluster (the kubernetes-pods
# job and PodMonitors alike); the autoscalers' selectors may use them besides the metric's own.
TARGET_LABELS = {"namespace", "pod"}


def _strict(schema: dict) -> dict:
    """A CRD's structural schema with unknown fields refused where the API server would prune them."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: _strict(sub) for name, sub in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [_strict(sub) for sub in out[key]]
    return out


def _crd_errors(doc: dict) -> list[str]:
    path = CRD_SCHEMAS[(doc["apiVersion"], doc["kind"])]
    validator = jsonschema.Draft4Validator(_strict(yaml.safe_load(path.read_text())))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _keda_cel_rule_errors(doc: dict) -> list[str]:
    """The ScaledObject CRD's one CEL rule (x-kubernetes-validations, which jsonschema cannot run)."""
    spec = doc["spec"]
    if "minReplicaCount" in spec and spec["minReplicaCount"] > spec.get("maxReplicaCount", 100):
        return ["minReplicaCount must be less than or equal to maxReplicaCount"]
    return []


def test_every_manifest_is_a_kind_the_tests_validate():
    kinds = [(d["apiVersion"], d["kind"]) for _, d in DOCS]
    assert set(CRD_SCHEMAS) <= set(kinds)
    assert {k for _, k in kinds} >= {"Namespace", "Deployment", "Service", "HorizontalPodAutoscaler"}
    namespace = one("Namespace")["metadata"]["name"]
    elsewhere = [
        f"{n}:{d['kind']}" for n, d in DOCS if d["kind"] != "Namespace" and d["metadata"]["namespace"] != namespace
    ]
    assert not elsewhere, f"outside namespace.yaml's namespace, which the PromQL selectors name: {elsewhere}"


@pytest.mark.parametrize("release", K8S_RELEASES)
def test_core_objects_are_valid_for_the_kubernetes_release(release):
    checked = []
    for name, doc in DOCS:
        if (doc["apiVersion"], doc["kind"]) not in CRD_SCHEMAS:
            kubernetes_validate.validate(doc, release, strict=True)
            checked.append(f"{name}:{doc['kind']}")
    assert len(checked) == len(DOCS) - len(CRD_SCHEMAS), checked


def test_custom_resources_are_valid_for_their_vendored_crd_schemas():
    for name, doc in DOCS:
        if (doc["apiVersion"], doc["kind"]) in CRD_SCHEMAS:
            assert _crd_errors(doc) == [], name
    assert _keda_cel_rule_errors(one("ScaledObject")) == []
    rules = re.findall(r"x-kubernetes-validations", CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")].read_text())
    assert len(rules) == 1, "a new CEL rule in the vendored KEDA schema needs its check in _keda_cel_rule_errors"


def test_the_validators_refuse_misspelled_and_mistyped_fields():
    deployment = copy.deepcopy(one("Deployment"))
    pod = deployment["spec"]["template"]["spec"]
    pod["terminationGracePeriodSecond"] = pod.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriodSecond"):
        kubernetes_validate.validate(deployment, K8S_RELEASES[0], strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="sleep"):  # no preStop sleep before 1.29
        kubernetes_validate.validate(one("Deployment"), "1.28.0", strict=True)
    isvc = copy.deepcopy(one("InferenceService"))
    isvc["spec"]["predictor"]["containers"][0]["readinessProbe"]["httpGet"]["paths"] = "/v2/health/ready"
    assert any("'paths' was unexpected" in e for e in _crd_errors(isvc))
    scaled = copy.deepcopy(one("ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 16  # trigger metadata holds strings only
    assert any("is not of type 'string'" in e for e in _crd_errors(scaled))
    scaled["spec"]["minReplicaCount"] = 9
    assert _keda_cel_rule_errors(scaled)


def test_vendored_schemas_name_their_source_release_and_licence():
    for (api_version, kind), path in CRD_SCHEMAS.items():
        header = " ".join(line[2:] for line in path.read_text().splitlines() if line.startswith("# "))
        group, version = api_version.split("/")
        assert f"{kind} ({group}/{version})" in header
        assert re.search(r"from \S+/\S+ release v[\d.]+ \(commit [0-9a-f]{40}\)", header), header
        assert "Apache License 2.0" in header


def test_container_args_parse_with_gpufeeds_own_parser_and_config():
    with DOCKERFILE.open() as f:
        entrypoint = next(json.loads(line.split(None, 1)[1]) for line in f if line.startswith("ENTRYPOINT"))
    assert entrypoint == ["gpufeed"]
    for kind, pod in server_pods().items():
        box = container(pod)
        assert "command" not in box, f"{kind}: args follow the image's entrypoint {entrypoint}"
        assert box["image"] == f"gpufeed-server:{__version__}", kind
        args, cfg = parsed(box["args"])
        assert args.command == "serve" and args.host == "0.0.0.0", kind
        assert [p["containerPort"] for p in box["ports"]] == [args.port], kind
        assert cfg.device == "gpu", f"{kind}: a pod without a working GPU must fail, not serve from the CPU"
        mounts = {m["mountPath"]: m for m in box.get("volumeMounts", ())}
        if kind == "Deployment":
            assert mounts[str(args.model_repo)]["readOnly"] is True
        else:  # KServe mounts STORAGE_URI at /mnt/models
            assert str(args.model_repo) == "/mnt/models"


def test_probes_ask_routes_the_server_answers_on_its_port():
    def endpoint(path: str):
        scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
        for route in _app._routes():
            if route.matches(scope)[0] is Match.FULL:
                return route.endpoint
        raise AssertionError(f"no route of the server answers GET {path}")

    for kind, pod in server_pods().items():
        box = container(pod)
        args, _ = parsed(box["args"])
        ports = {p.get("name"): p["containerPort"] for p in box["ports"]}
        expected = {"startupProbe": _app.ready, "readinessProbe": _app.ready, "livenessProbe": _app.live}
        for probe, handler in expected.items():
            get = box[probe]["httpGet"]
            assert endpoint(get["path"]) is handler, f"{kind} {probe}"
            assert ports.get(get["port"], get["port"]) == args.port, f"{kind} {probe}"
        annotations = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
        annotations = annotations if kind == "Deployment" else pod["annotations"]
        assert int(annotations["prometheus.io/port"]) == args.port, kind
        assert endpoint(annotations["prometheus.io/path"]) is _app.metrics_endpoint


def test_autoscalers_read_a_gauge_the_server_exports_with_its_labels():
    families = {f.name: f.type for f in ServerMetrics({"model": 8}).registry.collect()}
    contract = metric_by_name()
    for where, query in queries().items():
        names = metric_names(re.sub(r"<<[^>]*>>", "", query))
        assert names == {"gpufeed_server_inflight_requests"}, where
        (name,) = names
        assert families.get(name) == "gauge", f"{where}: {name} is not a gauge of the server's registry"
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", " ".join(re.findall(r"\{([^}]*)\}", query))):
            assert label in set(contract[name].labels) | TARGET_LABELS, f"{where}: label {label}"


def _matchers(query: str) -> dict[str, tuple[str, str]]:
    return {label: (op, value) for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', query)}


def test_each_query_selects_its_own_pods_and_nothing_else():
    deployment_pod = f"{one('Deployment')['metadata']['name']}-6d4cf56db6-8xk2p"
    predictor_pod = f"{one('InferenceService')['metadata']['name']}-predictor-5b7d9c8f4-q2w3e"
    others = ["gpufeed-models-upload", "gpufeed-server", "other-6d4cf56db6-8xk2p"]
    found = queries()
    for where, own in (("keda.yaml", deployment_pod), ("kserve.yaml", predictor_pod)):
        matchers = _matchers(found[where])
        assert matchers["namespace"] == ("=", one("Namespace")["metadata"]["name"]), where
        op, pattern = matchers["pod"]
        assert op == "=~" and re.fullmatch(pattern, own), f"{where}: {pattern} misses {own}"
        for pod in [*others, predictor_pod if own == deployment_pod else deployment_pod]:
            assert not re.fullmatch(pattern, pod), f"{where}: {pattern} also selects {pod}"


def test_the_autoscalers_scale_the_server_with_one_target_per_replica():
    deployment = one("Deployment")
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    hpa, scaled = one("HorizontalPodAutoscaler")["spec"], one("ScaledObject")["spec"]
    for ref in (hpa["scaleTargetRef"], scaled["scaleTargetRef"]):
        assert ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert hpa["metrics"][0]["pods"]["target"]["type"] == "AverageValue"
    (metric,) = predictor()["autoScaling"]["metrics"]
    targets = {
        hpa["metrics"][0]["pods"]["target"]["averageValue"],
        trigger["metadata"]["threshold"],
        metric["external"]["target"]["value"],
    }
    assert len(targets) == 1, f"one in-flight target per replica everywhere, got {targets}"
    assert scaled["fallback"]["replicas"] >= scaled["minReplicaCount"]


def test_the_inference_service_passes_kserves_admission_rules():
    """KServe 0.20's webhook rules for this mode (pkg/apis/serving/v1beta1/inference_service_validation.go)."""
    isvc = one("InferenceService")
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
    assert annotations["serving.kserve.io/autoscalerClass"] == "keda"
    spec = isvc["spec"]["predictor"]
    assert "scaleMetric" not in spec, "KEDA takes no scaleMetric"
    assert container(spec)["name"] == "kserve-container"
    for metric in spec["autoScaling"]["metrics"]:
        external = metric["external"]
        assert metric["type"] == "External" and external["metric"]["query"]
        assert external["target"]["type"] == "Value" and external["target"]["value"]
    storage = {e["name"]: e.get("value") for e in container(spec)["env"]}["STORAGE_URI"]
    assert storage == f"pvc://{one('PersistentVolumeClaim')['metadata']['name']}"


def test_the_grace_period_outlasts_the_prestop_sleep_and_gpufeeds_longest_drain():
    for kind, pod in server_pods().items():
        box = container(pod)
        _, cfg = parsed(box["args"])
        pre_stop_s = box["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain_s = longest_drain_seconds(cfg.serve)
        assert drain_s > longest_drain_seconds(ServeConfig()), "the shutdown delay adds to the default drain"
        assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s, (kind, pre_stop_s, drain_s)


def test_each_replica_runs_as_the_images_user_on_one_gpu():
    uid = int(re.search(r"useradd .*--uid (\d+)", DOCKERFILE.read_text()).group(1))
    for kind, pod in server_pods().items():
        assert pod["securityContext"]["runAsUser"] == uid, kind
        resources = container(pod)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 1, kind


def test_the_service_and_the_volume_reach_the_deployments_pods():
    deployment, service = one("Deployment"), one("Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in container(deployment["spec"]["template"]["spec"])["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == one("PersistentVolumeClaim")["metadata"]["name"]
