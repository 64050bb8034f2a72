"""Helpers for the export and server tests: small exported models and hand-made bad inputs.

Exports are cached per test session (they take seconds each on a CPU), in a temporary folder.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from gpufeed.models import checkpoint_path, create_model, export_model, model_state

IMAGE_MODEL = "small"  # smallcnn, 48 px, batch sizes 1, 2, 4
CLIP_MODEL = "clips"  # r3d_small, 32 px, 4 frames, batch sizes 1, 2
IMAGE_BATCH = 4
CLIP_BATCH = 2
CLASSES = ("amber", "birch", "cedar", "daisy")
DENSE_SIZE = 64  # the dense models' input, square


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gpufeed-serve-tests-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def write_checkpoint(run_dir: Path, name: str, step: int = 7, seed: int = 0, **spec) -> Path:
    """A checkpoint exactly as training writes it (the contract in models/_io.py)."""
    torch.manual_seed(seed)
    model = create_model(name, **spec)
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**model_state(model), "step": step}, path)
    return path


@functools.cache
def exported_repo() -> Path:
    """A model repository with an image model and a clip model, exported once per session."""
    root = _workdir()
    repo = root / "repo"
    image_ckpt = write_checkpoint(root / "run-image", "smallcnn", num_classes=4, size_px=48, labels=CLASSES)
    export_model(image_ckpt, repo / IMAGE_MODEL, batch_size=IMAGE_BATCH)
    clip_ckpt = write_checkpoint(
        root / "run-clip", "r3d_small", num_classes=4, size_px=32, clip_length_frames=4, seed=1
    )
    export_model(clip_ckpt, repo / CLIP_MODEL, batch_size=CLIP_BATCH)
    return repo


@functools.cache
def exported_dense_repo() -> Path:
    """A model repository with a depth model ``depth`` and a 4-class segmentation model ``seg`` (U-Nets at
    64 px, batch sizes 1 and 2), exported once per session."""
    root = _workdir() / "dense"
    common = {"size_px": DENSE_SIZE, "eval_crop_fraction": 1.0}
    depth = write_checkpoint(
        root / "run-depth", "unet_resnet18", task="depth", num_classes=1, depth_scale=0.001, map_fill=0, **common
    )
    seg = write_checkpoint(
        root / "run-seg", "unet_resnet18", task="segmentation", num_classes=4, map_fill=255, seed=1, **common
    )
    export_model(depth, root / "repo" / "depth", batch_sizes=[1, 2])
    export_model(seg, root / "repo" / "seg", batch_sizes=[1, 2])
    return root / "repo"


def encode(pixels: np.ndarray, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buffer.getvalue()


KSERVE_CLIENT = Path(__file__).parent / "kserve_client.py"


def run_kserve_client(
    protocol: str, address: str, mode: str, files: list[Path], token: str | None = None, model: str = IMAGE_MODEL
) -> tuple[int, dict]:
    """KServe's own SDK (``kserve_client.py``, in a subprocess) sending ``files`` to ``model`` (default ``IMAGE_MODEL``).

    Args:
        protocol: ``rest`` or ``grpc``; ``address`` is ``http://host:port`` or ``host:port``.
        mode: How the SDK sends the images (see ``kserve_client.py``).
        token: Bearer token the client sends, if the server wants one.

    Returns:
        The client's exit status and the JSON line it printed last.
    """
    env = {**os.environ, "GPUFEED_TEST_TOKEN": token} if token is not None else None
    done = subprocess.run(
        [sys.executable, str(KSERVE_CLIENT), protocol, address, model, mode, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"kserve client printed nothing; stderr:\n{done.stderr[-3000:]}"
    return done.returncode, json.loads(lines[-1])


def kserve_image_outputs(url: str, model: str, image: bytes) -> dict[str, tuple[str, np.ndarray]]:
    """One encoded image through KServe v2 over HTTP (base64 BYTES): output name -> (datatype, array)."""
    import base64

    import httpx

    body = {
        "inputs": [
            {
                "name": "image",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"content_type": "base64"},
                "data": [base64.b64encode(image).decode()],
            }
        ]
    }
    answer = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    return {o["name"]: (o["datatype"], np.array(o["data"], np.float32).reshape(o["shape"])) for o in outputs}
