"""The demo's dense stage: RGB + depth pairs checked, trained, exported, served as a 16-bit PNG.

:func:`run_dense_demo` checks the synthetic paired splits (``data/dense/train``, ``data/dense/val``
from ``gpufeed synth``), trains ``unet_resnet18`` on depth for a few steps (loader-vs-compute table
and the abs_rel / rmse / delta1 evaluation printed as in training), exports it, serves it, and
asks the REST route for one validation image's depth map as a 16-bit PNG at the image's own
size, which it writes to ``OUT/dense-depth.png``.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.config import Config, parse_config
from gpufeed.core import to_mapping
from gpufeed.demo._base import banner
from gpufeed.device import DeviceChoice
from gpufeed.models import export_model
from gpufeed.pipelines import check_path
from gpufeed.server import start_server
from gpufeed.synth import write_paired_split
from gpufeed.train import train

__all__ = ["dense_demo_config", "run_dense_demo"]

# Layered over the demo's config: the paired splits, a small non-square input, a short run.
DENSE_TRAIN: dict[str, dict[str, Any]] = {
    "data": {"train": {"root": "data/dense/train"}, "val": {"root": "data/dense/val"}, "depth_scale": 0.001},
    "image": {"size_px": [64, 48], "crop_area": [0.5, 1.0]},
    "loader": {"batch_size": 8, "last_batch": "drop"},
    "model": {"name": "unet_resnet18"},
    "train": {"epochs": 2, "lr": 0.003, "checkpoint_every_steps": 0, "keep_checkpoints": 1},
    "augment": {"ops": ["color_jitter", "horizontal_flip"]},
    "telemetry": {"metrics_port": 0},
}


def dense_demo_config(cfg: Config, out: Path) -> Config:
    """The demo config with the dense sections over it (the data paths resolved under ``out``)."""
    tree = to_mapping(cfg)
    for section, values in DENSE_TRAIN.items():
        tree[section] = {**tree.get(section, {}), **values}
    return parse_config(tree, base_dir=Path(out).resolve())


def run_dense_demo(out: str | Path, cfg: Config, device: DeviceChoice) -> dict:
    """Check, train, export and serve the depth model (see the module docs); returns what it measured.

    Args:
        out: The demo's run folder (holding ``data/dense`` from the image stage's ``gpufeed synth``).
        cfg: The demo's config (:func:`gpufeed.demo.demo_config`), resolved under ``out``.
        device: Where to serve.
    """
    import httpx
    from PIL import Image

    out = Path(out)
    banner("dense targets: RGB + 16-bit depth pairs")
    dense = out / "data" / "dense"
    for split, count, seed in (("train", 16, cfg.seed), ("val", 8, cfg.seed + 1)):
        if not (dense / split / "rgb").is_dir():  # a data folder written before synth made pairs
            write_paired_split(dense / split, count, 96, 72, seed)
    report = check_path(out / "data" / "dense", progress=False)
    print(
        f"checked {report.checked} files of {len(report.sources)} paired splits: {'ok' if report.ok else report.table()}"
    )
    run_dir = out / "train-unet_resnet18"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a demo run starts fresh every time
    result = train(dense_demo_config(cfg, out), run_dir)
    last = result.evaluations[-1] if result.evaluations else {}
    shown = {k: last[k] for k in ("abs_rel", "rmse", "delta1") if last.get(k) is not None}
    print("final evaluation: " + ", ".join(f"{k} {v:.3f}" for k, v in shown.items()))
    model_dir = out / "models" / "depth"
    export_model(run_dir, model_dir, batch_sizes=[1, 2], device=device)
    image_path = sorted((out / "data" / "dense" / "val" / "rgb").glob("*.jpg"))[0]
    server = start_server(model=model_dir, cfg=cfg, port=0, device=device)
    try:
        answer = httpx.post(
            f"{server.url}/v1/models/depth/predict?size=input",
            content=image_path.read_bytes(),
            headers={"content-type": "image/jpeg", "accept": "image/png"},
            timeout=120,
        )
    finally:
        server.stop()
    answer.raise_for_status()
    depth = np.asarray(Image.open(io.BytesIO(answer.content)))
    png = out / "dense-depth.png"
    png.write_bytes(answer.content)
    print(
        f"served {image_path.name}: a {depth.shape[1]}x{depth.shape[0]} {depth.dtype} depth PNG "
        f"(values {int(depth.min())}..{int(depth.max())} mm) written to {png}"
    )
    return {"evaluation": shown, "png": str(png), "shape": list(depth.shape), "dtype": str(depth.dtype)}
