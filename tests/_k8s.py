"""The manifests of docker/k8s as the Kubernetes tests read them (tests/test_k8s.py, tests/test_k8s_live.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from gpufeed.cli import build_parser
from gpufeed.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "docker" / "k8s"
ADAPTER_VALUES = K8S / "helm" / "prometheus-adapter-values.yaml"

# Every object of every manifest (docker/k8s/*.yaml), with its file's name.
DOCS = [(p.name, doc) for p in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(p.read_text()) if doc]


def one(kind: str) -> dict:
    """The one object of this kind among the manifests."""
    (doc,) = [d for _, d in DOCS if d["kind"] == kind]
    return doc


def predictor() -> dict:
    """The InferenceService's predictor: a pod spec plus KServe's fields."""
    return one("InferenceService")["spec"]["predictor"]


def server_pods() -> dict[str, dict]:
    """The pod specs that run gpufeed serve: the Deployment's template and the InferenceService's predictor."""
    return {"Deployment": one("Deployment")["spec"]["template"]["spec"], "InferenceService": predictor()}


def container(pod: dict) -> dict:
    """The pod's one container."""
    (only,) = pod["containers"]
    return only


def parsed(args: list[str]) -> tuple[argparse.Namespace, Config]:
    """Container args (after the image's entrypoint `gpufeed`) through gpufeed's own parser and config."""
    namespace = build_parser().parse_args(args)
    return namespace, load_config(namespace.config, namespace.overrides)


def queries() -> dict[str, str]:
    """Where each autoscaler reads gpufeed's metric -> the PromQL (or, for the HPA, the metric's name)."""
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    (rule,) = adapter["rules"]["custom"]
    (trigger,) = one("ScaledObject")["spec"]["triggers"]
    (metric,) = predictor()["autoScaling"]["metrics"]
    return {
        "keda.yaml": trigger["metadata"]["query"],
        "kserve.yaml": metric["external"]["metric"]["query"],
        "adapter series": rule["seriesQuery"],
        "adapter query": rule["metricsQuery"].replace("<<.Series>>", rule["name"]["as"]),
        "hpa.yaml": one("HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]["name"],
    }
