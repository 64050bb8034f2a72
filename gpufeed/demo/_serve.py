"""The serving stage of ``gpufeed demo``: export, serve, classify through tritonclient and REST, report.

:func:`run_serve_demo` exports the checkpoint it is given into ``OUT/models/<name>`` (a model
repository), starts the server on a free loopback port in this process, classifies the synthetic
evaluation images through ``tritonclient.http`` (KServe v2, binary BYTES tensors) and through
``POST /v1/models/{name}/predict``, checks both agree, and prints the per-stage latency table read
back from ``/metrics``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from gpufeed.config import Config
from gpufeed.device import DeviceChoice
from gpufeed.models import export_model
from gpufeed.pipelines import ImageDataset
from gpufeed.server import stage_latency_table, start_server

__all__ = ["DEMO_MODEL_NAME", "run_serve_demo"]

DEMO_MODEL_NAME = "classifier"


def run_serve_demo(
    cfg: Config, out: str | Path, device: DeviceChoice, checkpoint: str | Path, batch_size: int = 8
) -> dict:
    """Export ``checkpoint``, serve it, classify the evaluation images two ways, print the stage table.

    Args:
        cfg: The demo's :class:`gpufeed.config.Config` (``serve`` section, evaluation split).
        out: The demo's run folder.
        device: :class:`gpufeed.device.DeviceChoice`.
        checkpoint: A checkpoint file or a run folder.
        batch_size: The exported model's batch size.

    Returns:
        Figures: ``images`` classified, ``agreement`` of the two protocols' top-1 labels, top-1 ``accuracy``.
    """
    # The clients are the ``demo`` extra, which the command checks for before the demo starts.
    import httpx
    import tritonclient.http as triton

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the report
    out = Path(out)
    repo = out / "models"
    card = export_model(checkpoint, repo / DEMO_MODEL_NAME, batch_size=batch_size, device=device)
    print(f"exported {card.spec.name} -> {repo / DEMO_MODEL_NAME} (batch {card.batch_size}, {card.precision})")

    val = ImageDataset.from_config(cfg.data.val, cfg.data.classes, max_pixels=cfg.data.max_image_pixels)
    running = start_server(repo=repo, cfg=cfg, port=0, device=device)
    try:
        where = running.state.models[DEMO_MODEL_NAME].describe()
        print(
            f"serving on {running.url}: decode {where['decode']}, inference {where['providers'][0]} "
            f"(batch {where['batch_size']}, input buffer on {where['input_buffer']})"
        )
        client = triton.InferenceServerClient(running.url.removeprefix("http://"), concurrency=8)
        assert client.is_server_ready() and client.is_model_ready(DEMO_MODEL_NAME)
        blobs = [Path(p).read_bytes() for p in val.paths]
        start = time.perf_counter()
        pending = []
        for k in range(0, len(blobs), 4):  # 4 images per request, 8 requests in flight
            chunk = np.array(blobs[k : k + 4], dtype=object)
            tensor = triton.InferInput("image", [len(chunk)], "BYTES").set_data_from_numpy(chunk)
            pending.append(client.async_infer(DEMO_MODEL_NAME, [tensor]))
        kserve_top1 = np.concatenate([p.get_result().as_numpy("scores").argmax(1) for p in pending])
        kserve_seconds = time.perf_counter() - start

        rest_top1 = []
        with httpx.Client(base_url=running.url, timeout=60) as http:
            for path, blob in zip(val.paths, blobs, strict=True):
                kind = "image/png" if path.endswith(".png") else "image/jpeg"
                response = http.post(
                    f"/v1/models/{DEMO_MODEL_NAME}/predict", content=blob, headers={"content-type": kind}
                )
                response.raise_for_status()
                rest_top1.append(response.json()["predictions"][0]["top_k"][0]["index"])
            metrics_text = http.get("/metrics").text
        agree = float(np.mean(np.asarray(rest_top1) == kserve_top1))
        accuracy = float(np.mean(kserve_top1 == val.labels))
        labels = card.labels
        print(
            f"tritonclient: {len(blobs)} images in {len(pending)} requests, {len(blobs) / kserve_seconds:,.0f} images/s; "
            f"REST: {len(rest_top1)} requests; the two agree on {agree:.0%} of top-1 labels"
        )
        for k in range(min(4, len(blobs))):
            print(f"  {Path(val.paths[k]).name}: true {val.classes[val.labels[k]]}, predicted {labels[kserve_top1[k]]}")
        print(f"top-1 accuracy on the evaluation split: {accuracy:.0%}")
        print(
            f"\nper-stage latency read from {running.url}/metrics (queue_wait per image, decode and inference per batch):"
        )
        print(stage_latency_table(metrics_text, DEMO_MODEL_NAME))
        if agree < 1.0:
            raise SystemExit("tritonclient and REST disagree on the same images")
    finally:
        running.stop()
    return {"images": len(blobs), "agreement": agree, "accuracy": accuracy}
