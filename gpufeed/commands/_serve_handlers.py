"""The handlers of ``gpufeed export`` and ``gpufeed serve`` (their arguments are registered by ``serve.py``).

Imported only when one of them runs, so it imports the export and the server (torch, onnxruntime, DALI)
at module level. The server loads gRPC only when a gRPC port is asked for, after ``require_extra``.
"""

from __future__ import annotations

import argparse
import sys

from gpufeed.commands import require_extra
from gpufeed.config import load_config
from gpufeed.device import resolve_device
from gpufeed.models import export_model, resolve_batch_sizes
from gpufeed.server import serve_forever

__all__ = ["export", "serve"]


def export(args: argparse.Namespace) -> int:
    try:
        sizes = resolve_batch_sizes(args.batch_size, args.batch_sizes)
    except ValueError as err:
        flag = "--batch-sizes" if args.batch_sizes is not None else "--batch-size"
        print(f"gpufeed export: error: {flag}: {err}", file=sys.stderr)
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


def serve(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.auth_token_file is not None:
        overrides.append(f"serve.auth_token_file={args.auth_token_file}")
    cfg = load_config(args.config, overrides)
    if args.grpc_port is not None or cfg.serve.grpc_port:
        require_extra("grpc", "gpufeed serve --grpc-port")  # before any model is loaded
    return serve_forever(args.model_repo, args.model, cfg, host=args.host, port=args.port, grpc_port=args.grpc_port)
