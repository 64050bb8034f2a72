"""Fuzzing the server, against a real `gpufeed serve` process serving an image and a clip model:

* schemathesis (its CLI: coverage, fuzzing and stateful phases, positive and negative data) against
  the server's own /openapi.json: no 5xx, and every response conforms to the document;
* the generated corpus of malformed requests (gpufeed.reliability._corpus): every answer a 4xx with the
  expected reason and a message naming the problem, every refusal counted by reason, and valid
  requests still answered with the right scores after each category.

Run with -s to see the figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from _serving import CLIP_MODEL, IMAGE_MODEL, encode, exported_repo

from gpufeed import __version__
from gpufeed.models import read_model_card
from gpufeed.reliability._corpus import Target, malformed_corpus
from gpufeed.reliability._fuzz import FUZZ_LIMITS, run_corpus, valid_request_check
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.server._openapi import openapi_document

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]

REQUIRED_CATEGORIES = {
    "truncated_jpeg", "truncated_png", "corrupt_image", "bitflip_jpeg", "bitflip_png", "zero_bytes",
    "huge_dimensions", "wrong_content_type", "malformed_json", "oversized", "wrong_shape", "wrong_dtype",
    "unknown_model", "path_like", "long_names",
}  # fmt: skip


@pytest.fixture(scope="module")
def served():
    settings = [f"serve.{k}={v}" for k, v in FUZZ_LIMITS.items()] + ["serve.max_delay_ms=2", "serve.warmup_batches=1"]
    server = ServeProcess(exported_repo(), settings).start()
    yield server
    assert server.stop() == 0, "the server survived the fuzzing and drains cleanly"
    server.kill()


def test_openapi_document_lists_every_route(served):
    from gpufeed.config import parse_config
    from gpufeed.device import DeviceChoice
    from gpufeed.server._app import build_app
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    served_doc = httpx.get(served.url + "/openapi.json").json()
    assert served_doc == openapi_document([CLIP_MODEL, IMAGE_MODEL], __version__, auth=False)
    state = ServingState(load_repository(exported_repo()), parse_config(None).serve, DeviceChoice("cpu", None, "t"))
    routes = {(r.path, m.lower()) for r in build_app(state).routes for m in r.methods if m != "HEAD"}
    documented = {(p, m) for p, ops in served_doc["paths"].items() for m in ops}
    assert routes - documented == {("/openapi.json", "get")}, "every route is in the document (but the document itself)"
    assert documented <= routes
    predict = served_doc["paths"]["/v1/models/{name}/predict"]["post"]
    assert set(predict["requestBody"]["content"]) == {"image/jpeg", "image/png", "multipart/form-data", "video/mp4"}
    infer = served_doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InferRequest"
    }
    assert infer["parameters"][0]["schema"]["enum"] == [CLIP_MODEL, IMAGE_MODEL], "the fuzzer reaches real models"


def test_schemathesis_against_the_servers_own_schema(served, tmp_path):
    # positive_data_acceptance is left out: a schema cannot say "a decodable JPEG" or "data holds
    # prod(shape) values", so schema-valid random bodies are rightly refused with 400/415.
    cmd = [
        str(Path(sys.executable).parent / "schemathesis"), "run", served.url + "/openapi.json",
        "--exclude-checks", "positive_data_acceptance", "--max-examples", "30", "--seed", "1",
        "--generation-database", "none", "--no-color", "--report", "junit", "--report-dir", str(tmp_path),
        "--request-timeout", "30",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    summary = re.search(r"(\d+) generated, (.*)", done.stdout)
    print(f"\nschemathesis: {summary.group(0) if summary else done.stdout[-2000:]}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert summary and int(summary.group(1)) >= 300 and summary.group(2).startswith(f"{summary.group(1)} passed")
    assert "Selected: 20/20" in done.stdout and "Tested: 20" in done.stdout
    assert httpx.get(served.url + "/v2/health/ready").status_code == 200


def test_malformed_request_corpus(served):
    repo = exported_repo()
    cards = {name: read_model_card(repo / name) for name in (IMAGE_MODEL, CLIP_MODEL)}
    probes = malformed_corpus([Target.from_card(c) for c in cards.values()], **FUZZ_LIMITS)
    assert len(probes) >= 1000
    assert {p.category for p in probes} >= REQUIRED_CATEGORIES
    jpeg = encode(np.random.default_rng(5).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    checks = [valid_request_check(served.host, served.port, repo / name, jpeg) for name in cards]
    report = run_corpus(served.host, served.port, probes, checks, progress=False)
    print(report.table())
    assert report.ok, report.problems()
    summary = report.figures
    assert all(status < 500 for status in summary["statuses"]) and 0 not in summary["statuses"]
    strict = {c: v for c, v in summary["categories"].items() if c not in ("bitflip_jpeg", "bitflip_png")}
    assert sum(v["decoded"] for v in strict.values()) <= 2, "only the two known still-decodable corruptions pass"
    assert summary["valid_checks"] == len({p.category for p in probes})
    assert served.running(), "the server process is alive"
    assert httpx.get(served.url + "/v2/health/ready").status_code == 200
