"""``gpufeed doctor``: what works on the GPU path, what falls back to the CPU, and why."""

from __future__ import annotations

import argparse

# Every gpufeed call imports this module to register its arguments; the handler, which imports the
# doctor's library (NVML through ctypes, the installed packages' files), is in _doctor_handlers.py.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the GPU path: driver, CUDA builds, libraries, nvJPEG, NVDEC, onnxruntime's CUDA provider",
        description="Probe every part of the GPU path on tiny media made in memory: the driver and its CUDA "
        "version, each package's CUDA build, the libraries the GPU code loads, torch on CUDA, DALI's GPU "
        "operators, nvJPEG, the hardware JPEG decoder, NVDEC per codec (h264, hevc, av1, vp9) and onnxruntime's "
        "CUDA provider; say what falls back to the CPU and why. Exit status 1 when the GPU path is broken "
        "(or, with --require-gpu, missing); 0 otherwise, including on a machine without a GPU.",
    )
    p.add_argument("--require-gpu", action="store_true", help="a machine without a usable GPU is an error (exit 1)")
    p.add_argument("--json", dest="json_out", nargs="?", const="-", metavar="FILE",
                   help="write the report as JSON to FILE (or to stdout with no FILE) instead of text")  # fmt: skip
    p.add_argument("--device-id", type=int, default=0, help="the CUDA device to probe (default 0)")
    p.add_argument("--model", metavar="PATH", help="also run this exported model (.onnx or model folder) once in the "
                   "server's session and report any node onnxruntime runs on the CPU inside a CUDA session")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=None, help="time limit of each probe's process (default 60)")
    p.set_defaults(func="gpufeed.commands._doctor_handlers:doctor")
