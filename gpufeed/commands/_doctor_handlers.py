"""The handler of ``gpufeed doctor`` (its arguments are registered by ``doctor.py``).

Imported only when the command runs. The doctor runs without DALI and onnxruntime (``cli.WITHOUT_STACK``):
its probes load them in child processes, never here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpufeed.core import write_json
from gpufeed.doctor import DEFAULT_TIMEOUT_S, run_doctor

__all__ = ["doctor"]


def doctor(args: argparse.Namespace) -> int:
    if args.device_id < 0:
        raise SystemExit(f"gpufeed doctor: error: --device-id {args.device_id} is negative; give a CUDA device index")
    timeout_s = DEFAULT_TIMEOUT_S if args.timeout_s is None else args.timeout_s
    if timeout_s <= 0:
        raise SystemExit(f"gpufeed doctor: error: --timeout-s {timeout_s:g} must be positive")
    if args.model is not None and not (Path(args.model).is_file() or (Path(args.model) / "model.onnx").is_file()):
        raise SystemExit(f"gpufeed doctor: error: --model {args.model}: no .onnx file or model folder with model.onnx")
    report = run_doctor(require_gpu=args.require_gpu, device_id=args.device_id, timeout_s=timeout_s, model=args.model)
    if args.json_out == "-":
        print(json.dumps(report.to_json(), indent=2))
    else:
        if args.json_out:
            write_json(Path(args.json_out), report.to_json())
        print(report.format_text())
    return report.exit_code
