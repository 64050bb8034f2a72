"""The serving page's curl example for an image as base64 in KServe v2 JSON, run as written.

Before, the example inlined the base64 in curl's arguments, and a 200 KB JPEG (a 270 KB argument,
over Linux's 128 KiB per argument) failed with "Argument list too long" before curl ran. The block
is read from docs/serving.md and run by bash against the session's server; only the address and
the model name change (the docs' ``localhost:8000`` and ``cats``), and it must classify the image as
the binary tensor extension does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from _serving import IMAGE_MODEL, encode

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("curl") is None or shutil.which("base64") is None, reason="needs curl, base64"),
]

SERVING = Path(__file__).resolve().parent.parent / "docs" / "serving.md"


def _curl_base64_block() -> str:
    blocks = re.findall(r"^```sh\n(.*?)^```", SERVING.read_text(), re.M | re.S)
    found = [b for b in blocks if "curl" in b and '"content_type": "base64"' in b]
    assert len(found) == 1, "docs/serving.md has one curl example sending base64 in JSON"
    return found[0]


def test_the_base64_curl_example_classifies_a_200_kb_jpeg(kserve_server, tmp_path):
    pixels = np.random.default_rng(3).integers(0, 256, (480, 460, 3), dtype=np.uint8)
    jpeg = encode(pixels)
    assert len(jpeg) > 200_000, "a 200 KB JPEG: its base64 is over Linux's 128 KiB per argument"
    (tmp_path / "cat.jpg").write_bytes(jpeg)
    block = _curl_base64_block()
    assert "localhost:8000" in block and "/models/cats/" in block
    script = block.replace("localhost:8000", kserve_server.url.removeprefix("http://"))
    script = script.replace("/models/cats/", f"/models/{IMAGE_MODEL}/")
    done = subprocess.run(
        ["bash", "-c", "set -o pipefail\n" + script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout, done.stderr[-2000:]
    outputs = {o["name"]: o for o in json.loads(done.stdout)["outputs"]}
    client = triton.InferenceServerClient(kserve_server.url.removeprefix("http://"))
    tensor = triton.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([jpeg], dtype=object), binary_data=True)
    reference = client.infer(IMAGE_MODEL, [tensor]).as_numpy("scores")
    np.testing.assert_array_equal(np.array(outputs["scores"]["data"], np.float32).reshape(reference.shape), reference)
