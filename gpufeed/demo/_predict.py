"""The demo's predictions stage: the trained clip model scores every frame of the synthetic videos.

What a behaviour lab does after training: ``gpufeed predict`` with the clip checkpoint over the
videos, one CSV of per-frame probabilities and one picture per video (``--plot``), the checkpoint
exported for onnxruntime into the demo's own folder (not the user's cache). The stage then checks
what it wrote: every frame has one row, and every row's probabilities are probabilities.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed.config import Config
from gpufeed.demo._base import banner
from gpufeed.device import DeviceChoice
from gpufeed.models import find_checkpoint
from gpufeed.predict import load_predictor, predict_videos, read_predictions_csv

__all__ = ["run_predict_demo"]


def run_predict_demo(out: str | Path, cfg: Config, choice: DeviceChoice, clip_run: Path) -> Path:
    """Score every frame of ``cfg.video.val``'s videos with ``clip_run``'s checkpoint into ``out/predictions``.

    Returns:
        The predictions folder.

    Raises:
        SystemExit: A video failed, or an output is not one row of probabilities per frame.
    """
    banner("per-frame predictions")
    out = Path(out)
    predictor = load_predictor(find_checkpoint(clip_run), choice, export_cache=out / "exports")
    print(f"model: {predictor.describe()}")
    folder = out / "predictions"
    report = predict_videos(str(cfg.video.val), predictor, out=folder, overwrite=True, progress=False, plot=True)
    print(f"predict: {report.summary()}")
    if report.failed:
        raise SystemExit(f"predict failed: {report.failed[0].error}")
    for result in report.results:
        names, values = read_predictions_csv(result.output)
        if len(values) != result.frames or names != predictor.labels:
            raise SystemExit(f"{result.output}: {len(values)} rows of {names} for {result.frames} frames")
        if not (np.isfinite(values).all() and (values >= 0).all() and (values <= 1).all()):
            raise SystemExit(f"{result.output}: a value outside 0..1")
    first = report.results[0]
    print(f"{len(report.results)} CSVs of per-frame probabilities, e.g. {first.output}")
    print(f"and a picture of each: {first.output.with_name(first.output.name.replace('.csv', '.png'))}")
    return folder
