"""The demo's training stage: train a model for a few dozen steps on the synthetic data.

``run_train_demo(out, cfg)`` trains the image model (ResNet-18) into ``out/train-resnet18``,
prints the loader-vs-compute table, draws the report PNG and keeps the checkpoint for the
serving stage; ``model="clip_resnet18"`` trains the clip model on the synthetic videos the same
way (the demo config's ``video`` section).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpufeed.config import Config, parse_config
from gpufeed.core import to_mapping
from gpufeed.demo._base import banner
from gpufeed.train import draw_report, train

__all__ = ["demo_train_config", "run_train_demo"]

# Layered over the demo's data, image and loader sections.
DEMO_TRAIN: dict[str, dict[str, Any]] = {
    "train": {"epochs": 5, "lr": 0.002, "warmup_steps": 3, "checkpoint_every_steps": 0, "keep_checkpoints": 1},
    "augment": {"ops": ["color_jitter"]},
    "telemetry": {"metrics_port": 0},
}


def demo_train_config(cfg: Config, model: str = "resnet18") -> Config:
    """The demo config plus the training sections, for ``model``."""
    tree = to_mapping(cfg)
    for section, values in DEMO_TRAIN.items():
        tree[section] = {**tree.get(section, {}), **values}
    tree["model"] = {**tree.get("model", {}), "name": model}
    return parse_config(tree)


def run_train_demo(out: str | Path, cfg: Config, model: str = "resnet18") -> Path:
    """Train ``model`` into ``out/train-<model>``, replacing an earlier demo run.

    Args:
        out: The demo's run folder.
        cfg: The demo's config (:func:`gpufeed.demo.demo_config`).
        model: A registered model name (``resnet18``, ``clip_resnet18``).

    Returns:
        The training run folder, which holds the checkpoint the serving stage exports.
    """
    banner(f"training {model}")
    run_dir = Path(out) / f"train-{model}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a demo run starts fresh every time
    result = train(demo_train_config(cfg, model), run_dir)
    if result.evaluations:
        last = result.evaluations[-1]
        shown = {k: v for k, v in last.items() if k in ("accuracy", "macro_f1", "loss") and v is not None}
        print("final evaluation: " + ", ".join(f"{k} {v:.3f}" for k, v in shown.items()))
    png, _ = draw_report(run_dir)
    print(f"checkpoint for serving: {result.checkpoint}\nloader-vs-compute report: {png}")
    return run_dir
