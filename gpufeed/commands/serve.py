"""Serving commands: ``export`` (checkpoint -> ONNX model folder) and ``serve`` (HTTP inference server)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufeed.commands import require_extra
from gpufeed.device import resolve_device

# Deferred imports: every gpufeed call imports this module to register its arguments, so a handler
# imports the libraries it runs (torch, onnxruntime, DALI, yaml) itself: `gpufeed --help` stays light.


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
    p.set_defaults(func=_export)

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
    p.set_defaults(func=_serve)


def _export(args: argparse.Namespace) -> int:
    from gpufeed.models import export_model, resolve_batch_sizes

    try:
        sizes = resolve_batch_sizes(args.batch_size, args.batch_sizes)
    except ValueError as err:
        print(f"gpufeed export: error: --batch-sizes: {err}", file=sys.stderr)
        return 2
    card = export_model(
        args.source,
        args.out,
        batch_sizes=sizes,
        precision=args.precision,
        name=args.name,
        opset=args.opset,
        parity_data=args.parity_data,
        device=resolve_device(args.device),
    )
    print(
        f"wrote {args.out / 'model.onnx'} and model_card.json: {card.name} ({card.spec.name}, {card.spec.task}), "
        f"input {card.input_name} uint8 {list(card.input_shape)} {card.spec.input_layout} at batch sizes "
        f"{', '.join(map(str, card.batch_sizes))}, {card.precision}, "
        f"parity max |diff| {card.parity['max_abs_diff']:.3g}"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gpufeed.config import load_config
    from gpufeed.server import serve_forever

    overrides = list(args.overrides)
    if args.auth_token_file is not None:
        overrides.append(f"serve.auth_token_file={args.auth_token_file}")
    cfg = load_config(args.config, overrides)
    if args.grpc_port is not None or cfg.serve.grpc_port:
        require_extra("grpc", "gpufeed serve --grpc-port")  # before any model is loaded
    return serve_forever(args.model_repo, args.model, cfg, host=args.host, port=args.port, grpc_port=args.grpc_port)
