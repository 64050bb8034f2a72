"""gpufeed.demo: ``gpufeed demo``, the main job end to end on the embedded synthetic dataset.

Stages run in order, each printing what it did; the resolved config is saved in the run folder.
Everything is generated here, so the demo needs no downloads and runs the same on a laptop CPU
(DALI's CPU mode) and on a GPU machine.

The demo sits on top of the library and uses all of it; nothing below imports it. One private
module per stage:

* ``_images``: the synthetic dataset, its check, an epoch of each image loader.
* ``_video``: :func:`run_clip_demo`, clips read and verified frame by frame.
* ``_train``: :func:`run_train_demo`, a short training run of the image and clip models.
* ``_predict``: :func:`run_predict_demo`, the clip model's per-frame probabilities for every video, their pictures, and one video posted to the served model.
* ``_serve``: :func:`run_serve_demo`, export, serve, classify through tritonclient and REST.
* ``_dense``: :func:`run_dense_demo`, RGB + depth pairs checked, trained, exported, served as a PNG.
* ``_obs``: :func:`run_obs_demo`, the monitoring stack checked with promtool and a real Prometheus.
"""

from __future__ import annotations

from pathlib import Path

from gpufeed.config import Config, save_config
from gpufeed.demo._base import DEMO_CONFIG, banner, demo_config
from gpufeed.demo._dense import run_dense_demo
from gpufeed.demo._images import run_image_demo
from gpufeed.demo._obs import run_obs_demo
from gpufeed.demo._predict import run_predict_demo
from gpufeed.demo._serve import DEMO_MODEL_NAME, run_serve_demo
from gpufeed.demo._train import demo_train_config, run_train_demo
from gpufeed.demo._video import run_clip_demo
from gpufeed.models import find_checkpoint

__all__ = [
    "DEMO_CONFIG",
    "DEMO_MODEL_NAME",
    "demo_config",
    "demo_train_config",
    "run_clip_demo",
    "run_demo",
    "run_dense_demo",
    "run_obs_demo",
    "run_predict_demo",
    "run_serve_demo",
    "run_train_demo",
]


def run_demo(out: str | Path, device: str = "auto") -> Config:
    """Run every demo stage into ``out``.

    Args:
        out: The run folder: data, training runs, the model repository and ``config.yaml``.
        device: ``auto``, ``gpu`` or ``cpu``.

    Returns:
        The resolved config, as saved in ``out/config.yaml``.
    """
    out = Path(out)
    cfg = demo_config(out, device)
    save_config(cfg, out / "config.yaml")

    choice = run_image_demo(out, cfg)
    run_clip_demo(cfg, choice)

    image_run = run_train_demo(out, cfg)
    clip_run = run_train_demo(out, cfg, model="clip_resnet18")
    run_predict_demo(out, cfg, choice, clip_run)

    banner("serving")
    run_serve_demo(cfg, out, choice, find_checkpoint(image_run))
    run_dense_demo(out, cfg, choice)

    banner("monitoring")
    run_obs_demo(out)
    print(f"\nresolved config saved to {out / 'config.yaml'}")
    return cfg
