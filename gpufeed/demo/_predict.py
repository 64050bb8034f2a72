"""The demo's predictions stage: the trained clip model scores every frame of the synthetic videos.

What a behaviour lab does after training: ``gpufeed predict`` with the clip checkpoint over the
videos, one CSV of per-frame probabilities and one picture per video (``--plot``), the checkpoint
exported for onnxruntime into the demo's own folder (not the user's cache). The stage then checks
what it wrote: every frame has one row, and every row's probabilities are probabilities. Last, a
client's view: the checkpoint exported (``gpufeed export``) and served, the first video posted as an
mp4 to ``/v1/models/behaviour/predict``, and the answer checked against ``predict``'s CSV.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from gpufeed.config import Config
from gpufeed.demo._base import banner
from gpufeed.device import DeviceChoice
from gpufeed.models import export_model, find_checkpoint
from gpufeed.predict import load_predictor, predict_videos, read_predictions_csv
from gpufeed.server import start_server

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
    video = Path(str(cfg.video.val)) / first.name
    _serve_a_video(out, cfg, choice, find_checkpoint(clip_run), video, first.output, _tolerance(predictor, choice))
    return folder


def _tolerance(predictor, choice: DeviceChoice) -> float:
    """How far the served scores may be from ``predict``'s: the server runs the export on onnxruntime.

    On a GPU ``predict`` keeps PyTorch, whose cuDNN convolutions run in TF32 by default, while the
    server's CUDA provider runs fp32 (``serve.cuda_tf32`` off); the GPU tests bound that at 2e-3.
    Elsewhere both run the same export on onnxruntime and differ only in batch composition.
    """
    return 2e-3 if choice.is_gpu and predictor.runtime == "torch" else 1e-5


def _serve_a_video(
    out: Path, cfg: Config, choice: DeviceChoice, checkpoint: Path, video: Path, csv: Path, tolerance: float
) -> None:
    """Serve the clip model, post ``video`` as an mp4, and check the answer against ``predict``'s ``csv``."""
    import httpx  # the demo extra's client

    logging.getLogger("httpx").setLevel(logging.WARNING)
    folder = out / "served" / "behaviour"
    export_model(checkpoint, folder, device=choice)
    running = start_server(model=folder, cfg=cfg, port=0, device=choice)
    try:
        runs = running.state.models["behaviour"].describe()["video_window_runs"]
        started = time.perf_counter()
        answer = httpx.post(
            f"{running.url}/v1/models/behaviour/predict",
            content=video.read_bytes(),
            headers={"content-type": "video/mp4"},
            timeout=300,
        )
        seconds = time.perf_counter() - started
    finally:
        running.stop()
    if answer.status_code != 200:
        raise SystemExit(f"the served clip model answered {answer.status_code}: {answer.text[:300]}")
    served = np.asarray(answer.json()["scores"], dtype=np.float32)
    want = read_predictions_csv(csv)[1]
    diff = float(np.abs(served - want).max()) if served.shape == want.shape else float("inf")
    how = f"runs of {runs} windows" if runs else "windows one by one"
    print(
        f"served: {video.name} posted to /v1/models/behaviour/predict, {len(served)} frames in "
        f"{seconds:.2f} s ({how}); max |diff| against predict's CSV {diff:.2g}"
    )
    if diff > tolerance:
        raise SystemExit(f"the served video's scores differ from predict's by {diff:.2g} (more than {tolerance:g})")
