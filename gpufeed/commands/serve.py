"""Serving commands: ``export`` (checkpoint -> ONNX model folder) and ``serve`` (HTTP inference server)."""

from __future__ import annotations

import argparse
from pathlib import Path

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# libraries they run (torch, onnxruntime, DALI), are in _serve_handlers.py.


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint to ONNX (uint8 in, normalisation inside, a set of batch sizes) with a model card",
        description="Write MODEL_DIR/model.onnx and MODEL_DIR/model_card.json from a checkpoint or a run folder's "
        "newest checkpoint. The graph runs at each of the batch sizes (one onnxruntime session per size, static "
        "shapes in each); the server runs every batch at the smallest size that holds it. Runs the ONNX checker "
        "and compares onnxruntime with PyTorch at every batch size on real inputs (synthetic images through the "
        "evaluation pipeline, or rendered video frames for clip models); fails above the tolerance.",
    )
    p.add_argument("source", type=Path, metavar="CHECKPOINT_OR_RUN_DIR", help="checkpoint file or run folder")
    p.add_argument("--out", required=True, type=Path, metavar="MODEL_DIR", help="model folder to write")
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument(
        "--batch-size",
        type=_positive,
        metavar="N",
        help="the largest batch size; the sizes are the powers of two below it and N (default 8: 1 2 4 8)",
    )
    sizes.add_argument(
        "--batch-sizes",
        type=_positive,
        nargs="+",
        metavar="N",
        help="every batch size, ascending (e.g. 1 4 16; a single N fixes the graph's batch dimension at N)",
    )
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="fp16: half precision for GPUs")
    p.add_argument("--name", help="model name in the card (default: the MODEL_DIR folder name)")
    p.add_argument("--opset", type=_positive, default=18, help="ONNX opset (default 18)")
    p.add_argument(
        "--parity-data",
        type=Path,
        help="images for the parity check: list file or class folders (a dense model: also a paired split's rgb/)",
    )
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="where parity inputs are made")
    p.set_defaults(func="gpufeed.commands._serve_handlers:export")

    p = sub.add_parser(
        "serve",
        help="serve exported models over HTTP: KServe v2, simple REST, Prometheus /metrics",
        description="Serve a model repository (one folder per model; the folder name is the model name) or a single "
        "model folder. KServe v2 under /v2 (tritonclient works), POST /v1/models/NAME/predict with an image body "
        "(a video/* body for a clip model), GET /metrics, GET /openapi.json. Binds 127.0.0.1 unless told otherwise. "
        "SIGTERM drains: readiness turns false, new requests get 503, requests in flight are answered, then it exits 0.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-repo", type=Path, metavar="DIR", help="folder of model folders")
    where.add_argument("--model", type=Path, metavar="MODEL_DIR", help="one model folder")
    p.add_argument("--host", help="address to bind (default: serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: serve.port, 8000; 0 picks a free one)")
    p.add_argument(
        "--grpc-port",
        type=int,
        help="also serve KServe v2 over gRPC on this port (default: serve.grpc_port, off; 0 picks a free one); "
        "needs the grpc extra: pip install 'gpufeed[grpc]'",
    )
    p.add_argument("--config", type=Path, metavar="CFG", help="YAML config (its serve section and device)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="require 'Authorization: Bearer <token>' with the token in FILE (serve.auth_token_file; "
        "or set GPUFEED_SERVE_TOKEN)",
    )
    p.set_defaults(func="gpufeed.commands._serve_handlers:serve")
