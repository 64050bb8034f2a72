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

import contextlib
import json
import math
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from gpufeed.device import DeviceChoice
from gpufeed.doctor._probes import _timed, _words
from gpufeed.doctor._report import ProbeResult
from gpufeed.models import CARD_FILE, ONNX_FILE, read_model_card
from gpufeed.server import execution_providers, preload_cuda_libraries

__all__ = ["SHAPE_ELEMENTS", "model_file", "node_placements", "probe_placement", "read_profile"]

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


_UNESCAPED_NAME = re.compile(r'^(?P<head>.*?"name" :)"(?P<name>.*)_kernel_time"(?P<tail>,"args" : .*)$')


def read_profile(text: str) -> list[dict]:
    """The events of onnxruntime's profile file.

    onnxruntime writes node names into it unescaped, one event a line (``profiler.cc``): a name
    holding ``"`` breaks its line as JSON, and one holding ``\\b`` would read as another name. So
    each line's name, between ``"name" :"`` and ``_kernel_time"``, is taken as written and escaped
    before the line is read; a line that is still not JSON is left out.
    """
    events = []
    for raw in text.splitlines():
        line = raw.strip().removeprefix("[").removesuffix("]").removesuffix(",")
        match = _UNESCAPED_NAME.match(line)
        if match is not None:
            line = f"{match['head']}{json.dumps(match['name'] + '_kernel_time')}{match['tail']}"
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    if not events:  # not one event a line (another onnxruntime): the file as a whole
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(text)
    return events


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


class _Unfeedable(ValueError):
    """The probe cannot make an input for the model (a type it cannot make, a size it cannot know)."""


def _card_shape(folder: Path) -> tuple[int, ...] | None:
    """The input shape a model folder's card names (a batch of its smallest size), or ``None`` without a card."""
    if not (folder / CARD_FILE).is_file():
        return None
    card = read_model_card(folder)
    return (min(card.batch_sizes), *card.sample_shape)


def _zeros(session, card_shape: tuple[int, ...] | None) -> dict:
    feed: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.type not in _NUMPY:
            raise _Unfeedable(f"input {arg.name!r} has type {arg.type}, which the probe cannot make")
        dims = list(arg.shape)
        if len(session.get_inputs()) == 1 and card_shape is not None and len(card_shape) == len(dims):
            dims = [d if isinstance(d, int) and d > 0 else c for d, c in zip(dims, card_shape, strict=True)]
        symbolic = [str(d) for d in dims[1:] if not (isinstance(d, int) and d > 0)]
        if symbolic:  # a guessed height or width can fail a valid model (a Conv larger than the input)
            raise _Unfeedable(f"input {arg.name!r} has symbolic sizes {', '.join(symbolic)} besides its batch; "
                              "give the model folder, whose card names them")  # fmt: skip
        feed[arg.name] = np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in dims], dtype=_NUMPY[arg.type])
    return feed


def probe_placement(model: str, device_id: int | None) -> list[ProbeResult]:
    """Run ``model`` once in the server's session on ``device_id`` (``None``: the CPU) and report node placement."""
    import onnxruntime as ort

    started = time.monotonic()
    try:
        path = model_file(model)
        card_shape = _card_shape(Path(model)) if Path(model).is_dir() else None
    except (OSError, ValueError) as err:  # a card that does not read: the model is not servable as it is
        return [_result("fail", _words(err), started)]
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
            feed = _zeros(session, card_shape)
        except _Unfeedable as err:
            return [_result("skip", f"{path.name}: {err}", started)]
        except Exception as err:  # a model the server could not load is the finding
            return [_result("fail", f"{path.name} did not load: {_words(err)}", started)]
        try:
            session.run(None, feed)
        except Exception as err:
            return [_result("fail", f"{path.name} did not run on zeros of its input's shape: {_words(err)}", started)]
        nodes = node_placements(read_profile(Path(session.end_profiling()).read_text()))
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
