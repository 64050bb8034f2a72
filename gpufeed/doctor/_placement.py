"""Where onnxruntime runs each node of a user's model: ``gpufeed doctor --model PATH``.

onnxruntime gives a node its CUDA provider has no kernel for (an op, a data type, an attribute) to
the CPU provider, inside a CUDA session, without an error: each run then copies that node's inputs
to the host and its outputs back, and the served model is slower than its export suggested with
nothing in the logs. The doctor's own probe model checks the provider, not a user's graph. This
probe builds the session the server would (:func:`gpufeed.server.execution_providers`), runs one
batch of zeros with onnxruntime's profiler on, and reads each node's provider from the profile.

onnxruntime also places shape arithmetic (``Shape`` -> ``Gather`` -> ``Concat`` feeding a
``Reshape`` or ``Resize``) on the CPU on purpose: its tensors are a few int64 numbers on the host.
Such nodes (``Shape`` and ``Size``, which read only dimensions, and nodes whose every input and
output is an int64 or int32 tensor of at most :data:`SHAPE_ELEMENTS` numbers) are marked
``shape_only`` and not counted against the model.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from gpufeed.device import DeviceChoice
from gpufeed.doctor._probes import _timed, _words
from gpufeed.doctor._report import ProbeResult
from gpufeed.models import ONNX_FILE
from gpufeed.server import execution_providers, preload_cuda_libraries

__all__ = ["SHAPE_ELEMENTS", "model_file", "node_placements", "probe_placement"]

SHAPE_ELEMENTS = 8
"""Most numbers in an integer tensor of shape arithmetic (a rank-8 shape)."""
_NUMPY = {"tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(float)": np.float32,
          "tensor(float16)": np.float16, "tensor(double)": np.float64, "tensor(int32)": np.int32,
          "tensor(int64)": np.int64, "tensor(bool)": np.bool_}  # fmt: skip


def model_file(path: str | Path) -> Path:
    """The ONNX file of ``path``: an ``.onnx`` file, or a model folder holding ``model.onnx``.

    Raises:
        FileNotFoundError: Neither, naming the path and what was looked for.
    """
    path = Path(path)
    if path.is_dir():
        path = path / ONNX_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"--model {path}: no such ONNX file (give a .onnx file or a model folder with {ONNX_FILE})"
        )
    return path


def _small_ints(entries: list[dict]) -> bool:
    """Whether every tensor of a profile's ``*_type_shape`` list is an int32/int64 one of a few numbers."""
    return all(
        dtype in ("int64", "int32") and math.prod(dims) <= SHAPE_ELEMENTS
        for entry in entries
        for dtype, dims in entry.items()
    )


def _shape_only(event: dict) -> bool:
    args = event["args"]
    inputs, outputs = args.get("input_type_shape", []), args.get("output_type_shape", [])
    if not outputs or not _small_ints(outputs):
        return False
    # Shape and Size read a tensor's dimensions, never its data (which may be on the GPU).
    return args.get("op_name") in ("Shape", "Size") or (bool(inputs) and _small_ints(inputs))


def node_placements(profile: list[dict]) -> list[dict]:
    """Each node of one profiled run: ``{"node", "op", "provider", "shape_only"}``, in run order.

    Args:
        profile: The events of onnxruntime's profile JSON (``InferenceSession.end_profiling()``'s file).
    """
    seen: dict[str, dict] = {}
    for event in profile:
        args = event.get("args", {})
        if event.get("cat") != "Node" or "provider" not in args or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        seen.setdefault(name, {"node": name, "op": args.get("op_name", "?"), "provider": args["provider"],
                               "shape_only": _shape_only(event)})  # fmt: skip
    return list(seen.values())


def _zeros(session) -> dict:
    feed: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.type not in _NUMPY:
            raise ValueError(f"input {arg.name!r} has type {arg.type}, which the probe cannot make")
        dims = [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]  # a symbolic dimension: 1
        feed[arg.name] = np.zeros(dims, dtype=_NUMPY[arg.type])
    return feed


def probe_placement(model: str, device_id: int | None) -> list[ProbeResult]:
    """Run ``model`` once in the server's session on ``device_id`` (``None``: the CPU) and report node placement."""
    import onnxruntime as ort

    started = time.monotonic()
    path = model_file(model)
    device = DeviceChoice("gpu", device_id, "doctor") if device_id is not None else DeviceChoice("cpu", None, "doctor")
    providers = execution_providers("cuda" if device.is_gpu else "cpu", device, "fp32", None)
    if device.is_gpu:
        preload_cuda_libraries()
    with tempfile.TemporaryDirectory(prefix="gpufeed-placement-") as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        try:
            session = ort.InferenceSession(str(path), options, providers=providers)
            session.run(None, _zeros(session))
        except Exception as err:  # a model the server could not load or run is the finding
            return [_result("fail", f"{path.name} did not load or run: {_words(err)}", started)]
        nodes = node_placements(json.loads(Path(session.end_profiling()).read_text()))
    first = session.get_providers()[0]
    on_cpu = [n for n in nodes if n["provider"] == "CPUExecutionProvider" and not n["shape_only"]]
    details = {"model": str(path), "providers": session.get_providers(), "nodes": nodes}
    if first == "CPUExecutionProvider":
        where = "no GPU asked for" if not device.is_gpu else "the CUDA provider did not load (see onnxruntime-cuda)"
        status = "pass" if not device.is_gpu else "fail"
        return [_result(status, f"{len(nodes)} nodes ran on the CPU provider ({where})", started, details)]
    if not on_cpu:
        shape = sum(n["shape_only"] for n in nodes)
        return [_result("pass", f"every one of {len(nodes)} nodes ran on {first}"
                        + (f" ({shape} of shape arithmetic on the CPU, as onnxruntime intends)" if shape else ""),
                        started, details)]  # fmt: skip
    counts: dict[str, int] = {}
    for n in on_cpu:
        counts[n["op"]] = counts.get(n["op"], 0) + 1
    ops = ", ".join(f"{op} x{k}" if k > 1 else op for op, k in sorted(counts.items()))
    summary = (f"{len(on_cpu)} of {len(nodes)} nodes run on the CPU inside the {first} session ({ops}): each run "
               "copies their tensors to the host and back; re-export with ops the provider runs, or accept the cost")  # fmt: skip
    return [_result("warn", summary, started, details)]


def _result(status: str, summary: str, started: float, details: dict | None = None) -> ProbeResult:
    return _timed("model-placement", started, status, summary, details=details or {})
