"""Bad input, limits and overload: each gets its 4xx/5xx with a JSON error naming the problem, is counted
by reason, and the next good request still succeeds on a server that stays ready."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from _serving import (
    CLIP_MODEL,
    IMAGE_BATCH,
    IMAGE_MODEL,
    encode,
    exported_repo,
)
from prometheus_client.parser import text_string_to_metric_families

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import start_server
from gpufeed.server._repo import ModelRepoError
from gpufeed.synth._damaged import png_declaring, png_with_damaged_data

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
RNG = np.random.default_rng(0)
GOOD_JPEG = encode(RNG.integers(0, 256, (60, 80, 3), dtype=np.uint8))
GOOD_PNG = encode(RNG.integers(0, 256, (50, 40, 3), dtype=np.uint8), "PNG")
NOTE_ONLY = b'--zz\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n--zz--\r\n'


@pytest.fixture(scope="module")
def server(kserve_server):
    """The session's shared CPU server (tests/conftest.py)."""
    return kserve_server


def _errors(url) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name == "gpufeed_server_errors_total":
                out[(s.labels["model"], s.labels["reason"])] = s.value
    return out


def _rest(body, content_type="image/jpeg", model=IMAGE_MODEL, query=""):
    return lambda url: httpx.post(
        f"{url}/v1/models/{model}/predict{query}", content=body, headers={"content-type": content_type}
    )


def _v2(doc, model=IMAGE_MODEL):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return lambda url: httpx.post(f"{url}/v2/models/{model}/infer", content=body)


def _pixels(dtype, shape, name="pixels"):
    return {"inputs": [{"name": name, "datatype": dtype, "shape": shape, "data": [1] * int(np.prod(shape))}]}


def _bad_crc_png():
    data = bytearray(GOOD_PNG)
    data[data.index(b"IDAT") + 6] ^= 0xFF
    return bytes(data)


def _gif():
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="GIF")
    return buffer.getvalue()


BAD_REQUESTS = [
    ("truncated-jpeg", _rest(GOOD_JPEG[: len(GOOD_JPEG) // 2]), 400, "corrupt_image", "truncated JPEG"),
    ("not-an-image", _rest(b"hello, this is text" * 10), 400, "corrupt_image", "not a JPEG or PNG"),
    ("empty-body", _rest(b""), 400, "corrupt_image", "empty"),
    ("png-bad-crc", _rest(_bad_crc_png(), "image/png"), 400, "corrupt_image", "damaged"),
    ("png-damaged-data", _rest(png_with_damaged_data(GOOD_PNG), "image/png"), 400, "corrupt_image", "damaged"),
    ("gif", _rest(_gif(), "image/png"), 415, "unsupported_media_type", "GIF"),
    ("text-content-type", _rest(GOOD_JPEG, "text/plain"), 415, "unsupported_media_type", "text/plain"),
    ("bomb", _rest(png_declaring(30000, 30000), "image/png"), 400, "too_many_pixels", "900,000,000 pixels"),
    ("bad-top-k", _rest(GOOD_JPEG, query="?top_k=0"), 400, "malformed_request", "top_k"),
    (
        "multipart-no-file",
        _rest(NOTE_ONLY, "multipart/form-data; boundary=zz"),
        400,
        "malformed_request",
        "no file part",
    ),
    (
        "multipart-broken",
        _rest(NOTE_ONLY[:-8], "multipart/form-data; boundary=zz"),
        400,
        "malformed_request",
        "boundary",
    ),
    ("malformed-json", _v2(b'{"inputs": [ {"name": '), 400, "malformed_request", "not valid JSON"),
    ("fp32-pixels", _v2(_pixels("FP32", [1, 3, 48, 48])), 400, "bad_dtype", "must be UINT8"),
    ("wrong-shape", _v2(_pixels("UINT8", [1, 3, 32, 32])), 400, "bad_shape", "[-1, 3, 48, 48]"),
    ("clip-wrong-shape", _v2(_pixels("UINT8", [1, 3, 5, 32, 32]), CLIP_MODEL), 400, "bad_shape", "NCTHW"),
    ("unknown-input", _v2(_pixels("UINT8", [1], name="photo")), 400, "malformed_request", "no input 'photo'"),
    ("image-as-uint8", _v2(_pixels("UINT8", [1], name="image")), 400, "bad_dtype", "must be BYTES"),
    ("unknown-model", _rest(GOOD_JPEG, model="resnet9000"), 404, "unknown_model", "not served here"),
]


@pytest.mark.parametrize(
    ("send", "status", "reason", "words"), [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_input_gets_its_error_and_the_server_carries_on(server, send, status, reason, words):
    before = _errors(server.url)
    response = send(server.url)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["reason"] == reason and words in body["error"], body
    model = {"unknown_model": "unknown"}.get(reason, CLIP_MODEL if "NCTHW" in body["error"] else IMAGE_MODEL)
    assert _errors(server.url)[(model, reason)] == before.get((model, reason), 0) + 1
    assert "resnet9000" not in httpx.get(server.url + "/metrics").text, "request text never becomes a label"
    good = httpx.post(
        f"{server.url}/v1/models/{IMAGE_MODEL}/predict", content=GOOD_JPEG, headers={"content-type": "image/jpeg"}
    )
    assert good.status_code == 200 and len(good.json()["predictions"]) == 1
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200


def test_tritonclient_sees_the_error_message(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    bad = triton.InferInput("image", [1], "BYTES").set_data_from_numpy(
        np.array([GOOD_JPEG[: len(GOOD_JPEG) // 2]], dtype=object)
    )
    with pytest.raises(triton.InferenceServerException, match="truncated JPEG") as info:
        client.infer(IMAGE_MODEL, [bad])
    assert info.value.status() == "400"
    assert not client.is_model_ready("resnet9000")


@pytest.mark.live
def test_limits_overload_and_timeouts():
    cfg = parse_config(
        {
            "device": "cpu",
            "serve": {
                "max_delay_ms": 3000,  # a lone request waits for company longer than it may wait at all
                "batch_sizes": [IMAGE_BATCH],  # a full batch only: a lone request is not a batch by itself
                "request_timeout_seconds": 0.6,
                "queue_capacity": 1,
                "retry_after_seconds": 3,
                "max_body_bytes": 8192,
                "max_image_pixels": 70 * 70,
                "max_images_per_request": 2,
                "warmup_batches": 1,
            },
        }
    )
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    url = f"{running.url}/v1/models/{IMAGE_MODEL}/predict"
    try:
        big = httpx.post(url, content=b"\xff" * 9000, headers={"content-type": "image/jpeg"})
        assert big.status_code == 413 and big.json()["reason"] == "body_too_large"
        chunked = httpx.post(url, content=iter([b"\xff" * 4096] * 3), headers={"content-type": "image/jpeg"})
        assert chunked.status_code == 413, "a chunked body is counted as it streams"
        large = encode(np.zeros((80, 80, 3), np.uint8), "PNG")
        response = httpx.post(url, content=large, headers={"content-type": "image/png"})
        assert response.status_code == 400 and "80x80 = 6,400 pixels; the limit is 4,900" in response.json()["error"]
        small = encode(np.full((16, 16, 3), 90, np.uint8))
        files = [("image", (f"{k}.jpg", small, "image/jpeg")) for k in range(3)]
        response = httpx.post(url, files=files)
        assert response.status_code == 400 and "the limit is 2" in response.json()["error"]

        results = {}

        def first():
            results["first"] = httpx.post(url, content=GOOD_JPEG, headers={"content-type": "image/jpeg"})

        waiting = threading.Thread(target=first)
        waiting.start()
        deadline = time.monotonic() + 5
        while running.state.models[IMAGE_MODEL].batcher.depth == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        full = httpx.post(url, content=GOOD_JPEG, headers={"content-type": "image/jpeg"})
        assert full.status_code == 503 and full.json()["reason"] == "queue_full"
        assert full.headers["retry-after"] == "3"
        waiting.join(10)
        assert results["first"].status_code == 504 and results["first"].json()["reason"] == "timeout"
        assert running.state.models[IMAGE_MODEL].batcher.depth == 0, "a timed-out request leaves the queue"
        assert httpx.get(running.url + "/v2/health/ready").status_code == 200
        errors = _errors(running.url)
        for reason in ("body_too_large", "too_many_pixels", "queue_full", "timeout", "bad_shape"):
            assert errors[(IMAGE_MODEL, reason)] >= 1, reason
    finally:
        running.stop()


def test_bad_repositories_are_refused_before_serving(tmp_path):
    with pytest.raises(ModelRepoError, match="does not exist"):
        start_server(repo=tmp_path / "missing", device=CPU)
    (tmp_path / "repo" / "broken").mkdir(parents=True)
    with pytest.raises(ModelRepoError, match=r"holds no model folders"):
        start_server(repo=tmp_path / "repo", device=CPU)
    shutil.copy(exported_repo() / IMAGE_MODEL / "model.onnx", tmp_path / "repo" / "broken")  # a model gone wrong
    with pytest.raises(ModelRepoError, match=r"broken.model_card\.json is missing"):
        start_server(repo=tmp_path / "repo", device=CPU)
    with pytest.raises(ModelRepoError, match="is a model folder, not a repository"):
        start_server(repo=exported_repo() / IMAGE_MODEL, device=CPU)


def test_a_folder_that_is_no_model_is_left_out_with_a_warning(tmp_path, caplog):
    """One stray folder (notes/) in a repository stopped the server: every replica on a shared volume."""
    from gpufeed.server._repo import load_repository

    shutil.copytree(exported_repo() / IMAGE_MODEL, tmp_path / "repo" / IMAGE_MODEL)
    (tmp_path / "repo" / "notes").mkdir()
    (tmp_path / "repo" / "notes" / "todo.txt").write_text("retrain on Friday\n")
    caplog.set_level(logging.WARNING, logger="gpufeed.server")
    assert [entry.name for entry in load_repository(tmp_path / "repo")] == [IMAGE_MODEL]
    assert "notes/ hold(s) neither model_card.json nor model.onnx and are not served" in caplog.text


@pytest.mark.live
def test_serve_cli_announces_serves_and_drains_on_sigterm(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufeed",
            "serve",
            "--model",
            str(exported_repo() / IMAGE_MODEL),
            "--port",
            "0",
            "--set",
            "device=cpu",
            "--set",
            "serve.warmup_batches=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        base = line.split("listening on ")[1].split()[0]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        name = json.loads(Path(exported_repo() / IMAGE_MODEL / "model_card.json").read_text())["name"]
        response = httpx.post(
            f"{base}/v1/models/{name}/predict", content=GOOD_JPEG, headers={"content-type": "image/jpeg"}
        )
        assert response.status_code == 200, response.text
        proc.send_signal(signal.SIGTERM)
        # A graceful drain is a success: exit status 0 (uvicorn alone would re-raise the signal: 143).
        assert proc.wait(timeout=60) == 0
        assert "server stopped: 1 model(s) drained" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    broken = tmp_path / "repo" / "x"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"")  # a model gone wrong (a folder of neither file is skipped)
    done = subprocess.run(
        [sys.executable, "-m", "gpufeed", "serve", "--model-repo", str(tmp_path / "repo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "model_card.json is missing" in done.stderr and "Traceback" not in done.stderr
