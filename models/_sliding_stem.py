"""Windows at every frame for less: a stacked-frame model's first convolution shared along the frames.

``gpufeed predict`` scores a window at every frame (``hop_frames`` 1), so each frame is read by
``span`` windows. A stacked-frame clip model (``clip_resnet18``: a window's ``T`` frames stacked as
``3T`` channels, then a 2-D ResNet) mixes them all in its first convolution, which costs as much
as a quarter of the rest of the network: measured with onnxruntime on a 2-core CPU, clip
ResNet-18 at 112 px, 11 frames, it is 44-49 % of a window's time. Nothing of it can be reused
from one window to the next as written: each window sums its own frames under other weights.

But that sum is linear, and over consecutive windows it is a correlation along the frame axis.
Window ``w``'s first-convolution output is ``y[w] = sum_t W_t * x[w + t d]`` (``W_t``: the weights
of frame slot ``t``, ``*``: the 2-D convolution with its channel sum, ``d``: ``stride_frames``),
so for a block of ``N`` consecutive frames, by the discrete Fourier transform along the frames,
``Y_k = G_k * X_k`` with ``G_k = sum_t W_t exp(2 pi i k t d / N)``: one convolution of the block's
frames' ``k``-th frequency (3 complex channels) per frequency, ``N / 2 + 1`` of them, instead of
one of ``3T`` channels per window. For ``N`` frames and ``N - span + 1`` windows (``span =
(T - 1) d + 1``): clip ResNet-18 at 11 frames, 64 windows a block, does 38 convolutions of 6 real
channels into 128 instead of 64 of 33 into 64 (4.5x fewer multiply-adds), plus the two transforms
as matrix products (the forward one on the small input frames, the inverse one on the outputs).
No frame past a window's own takes part: the block's circular correlation wraps around only into
windows past ``N - span``, which are not returned.

:func:`sliding_window_graph` rewrites an exported model (``gpufeed export``'s graph: ``uint8``
clips ``(B, 3, T, H, W)`` -> cast, normalisation, reshape to ``(B, 3T, H, W)``, one convolution,
the rest) into one that takes a block's frames ``(N, 3, H, W)`` and answers the logits of its
``N - span + 1`` windows: the same graph from the first convolution's output on, with the
normalisation, the forward transform, the per-frequency convolutions (one grouped ``Conv``), the
inverse transform and the convolution's bias in front. Its arithmetic differs from the plain
graph's only in rounding (the transforms' matrices are computed in float64; measured on clip
ResNet-18 weights: max 2e-6 on first-convolution outputs near 3, 4e-8 on the logits). A graph of
another shape is refused with the reason (:class:`SlidingStemError`); ``predict`` then scores
windows one by one, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["SlidingStemError", "SlidingWindows", "sliding_window_graph"]

FRAMES_INPUT = "frames"
"""The rewritten graph's input: a block's frames, ``(N, 3, H, W)`` uint8."""

_PREFIX = "sliding_stem/"


class SlidingStemError(ValueError):
    """The graph is not a stacked-frame model whose first convolution can be shared (the message says why)."""


@dataclass(frozen=True)
class SlidingWindows:
    """What a rewritten graph takes and gives.

    Attributes:
        block_frames: Frames it takes, ``N``.
        windows: Windows it scores, ``N - span_frames + 1``, starting at frames ``0, 1, ...``.
        span_frames: Frames one window covers, ``(T - 1) * stride_frames + 1``.
        height_px, width_px: The frames' size.
    """

    block_frames: int
    windows: int
    span_frames: int
    height_px: int
    width_px: int


def _const(graph, name: str) -> np.ndarray | None:
    """An initializer's or a ``Constant`` node's value, else ``None``."""
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
    return None


def _per_channel(value: np.ndarray | None, what: str) -> np.ndarray:
    """A normalisation constant as 3 per-channel values (it must broadcast over frames and pixels)."""
    if value is None:
        raise SlidingStemError(f"the normalisation's {what} is not a constant")
    value = np.asarray(value, dtype=np.float64)
    if value.size == 1:
        return np.repeat(value.reshape(1), 3)
    if value.size == 3 and value.ndim >= 4 and value.shape[-4] == 3:
        return value.reshape(3)
    raise SlidingStemError(f"the normalisation's {what} has shape {value.shape}, not one value per channel")


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _chain(graph):
    """The nodes from the input to the first convolution: Cast, Mul, Add, Reshape, Conv (or the reason not)."""
    if len(graph.input) != 1:
        raise SlidingStemError(f"the graph takes {len(graph.input)} inputs, not one clip")
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    chain, tensor = [], graph.input[0].name
    for op in ("Cast", "Mul", "Add", "Reshape", "Conv"):
        users = consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type != op or users[0].input[0] != tensor:
            found = ", ".join(u.op_type for u in users) or "nothing"
            raise SlidingStemError(f"after {chain[-1].op_type if chain else 'the input'} comes {found}, not {op}")
        chain.append(users[0])
        tensor = users[0].output[0]
    return chain


def _unfixed_batch(graph, node, batch: int, inits: list):
    """``node``, or a copy whose ``Reshape`` to ``(batch, ...)`` reshapes to ``(-1, ...)`` (a new initializer)."""
    from onnx import helper, numpy_helper

    if node.op_type != "Reshape":
        return node
    target = _const(graph, node.input[1])
    if target is None or target.ndim != 1 or len(target) < 2 or int(target[0]) != batch or (target == -1).any():
        return node
    name = f"{_PREFIX}{node.output[0]}_shape"
    inits.append(numpy_helper.from_array(np.concatenate([[-1], target[1:]]).astype(np.int64), name))
    return helper.make_node("Reshape", [node.input[0], name], list(node.output), name=node.name, **_attrs(node))


@dataclass(frozen=True)
class _Stem:
    """The graph's front, read and checked: its nodes up to the first convolution, and that convolution's facts."""

    nodes: tuple
    batch: int  # the input's batch dimension (0: symbolic)
    height: int
    width: int
    scale: np.ndarray  # (3,) per channel
    shift: np.ndarray
    weight: np.ndarray  # (out_ch, 3T, kh, kw), channel c * T + t
    bias: np.ndarray | None
    attrs: dict  # strides, pads, dilations

    @property
    def out_hw(self) -> tuple[int, int]:
        kh, kw = self.weight.shape[2:]
        (sh, sw), pads, (dh, dw) = self.attrs["strides"], self.attrs["pads"], self.attrs["dilations"]
        out_h = (self.height + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
        return out_h, (self.width + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1


def _read_stem(graph, frames_t: int) -> _Stem:
    """The front of a stacked-frame model of ``frames_t`` frames (or :class:`SlidingStemError`, saying why not)."""
    from onnx import TensorProto

    cast, mul, add, reshape, conv = _chain(graph)
    dims = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    if len(dims) != 5 or dims[1] != 3 or dims[2] != frames_t or not dims[3] or not dims[4]:
        raise SlidingStemError(f"the graph takes {dims}, not (batch, 3, {frames_t}, H, W) clips")
    height, width = dims[3], dims[4]
    if graph.input[0].type.tensor_type.elem_type != TensorProto.UINT8 or _attrs(cast).get("to") != TensorProto.FLOAT:
        raise SlidingStemError("the graph does not cast uint8 clips to float32")
    target = _const(graph, reshape.input[1])
    if target is None or list(target[1:]) != [3 * frames_t, height, width]:
        raise SlidingStemError(f"the clip is reshaped to {target}, not (batch, {3 * frames_t}, {height}, {width})")
    weight = _const(graph, conv.input[1])
    attrs = _attrs(conv)
    if weight is None or weight.ndim != 4 or weight.shape[1] != 3 * frames_t or attrs.get("group", 1) != 1:
        raise SlidingStemError("the first convolution is not a plain 2-D one over the stacked frames")
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise SlidingStemError("the first convolution pads automatically")
    facts = {
        "strides": list(attrs.get("strides", [1, 1])),
        "pads": list(attrs.get("pads", [0, 0, 0, 0])),
        "dilations": list(attrs.get("dilations", [1, 1])),
    }
    return _Stem(
        nodes=(cast, mul, add, reshape, conv),
        batch=dims[0],
        height=height,
        width=width,
        scale=_per_channel(_const(graph, mul.input[1]), "scale"),
        shift=_per_channel(_const(graph, add.input[1]), "shift"),
        weight=weight,
        bias=_const(graph, conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None,
        attrs=facts,
    )


def _transforms(weight: np.ndarray, frames_t: int, stride_frames: int, n: int, windows: int):
    """The forward DFT (2K, N), the per-frequency grouped weights (K 2O, 6, kh, kw) and the inverse DFT (windows, 2K)."""
    out_ch, _, kh, kw = weight.shape
    k = n // 2 + 1
    freq = np.arange(k, dtype=np.float64)
    # Forward real DFT along the frames: rows cos, then -sin (real and imaginary parts).
    angle = 2 * math.pi * np.outer(freq, np.arange(n)) / n
    forward = np.concatenate([np.cos(angle), -np.sin(angle)])
    # G_k = sum_t W_t exp(+i 2 pi k t d / N): the conjugate of the slot weights' DFT (a correlation).
    slots = weight.astype(np.float64).reshape(out_ch, 3, frames_t, kh, kw).transpose(2, 0, 1, 3, 4)
    tap_angle = 2 * math.pi * np.outer(freq, np.arange(frames_t) * stride_frames) / n
    g_re = np.einsum("kt,tocij->kocij", np.cos(tap_angle), slots)
    g_im = np.einsum("kt,tocij->kocij", np.sin(tap_angle), slots)
    # One group per frequency: [Xr, Xi] (6 channels) -> [Yr, Yi] (2 x out_ch), a complex product.
    grouped = np.concatenate(
        [np.concatenate([g_re, -g_im], axis=2), np.concatenate([g_im, g_re], axis=2)], axis=1
    ).reshape(k * 2 * out_ch, 6, kh, kw)
    # Inverse real DFT for the windows kept; columns follow the grouped output: frequency, then re/im.
    weights = np.full(k, 2.0)
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0
    keep = angle[:, :windows]
    inverse = np.empty((windows, 2 * k))
    inverse[:, 0::2] = (weights[:, None] * np.cos(keep)).T / n
    inverse[:, 1::2] = (-weights[:, None] * np.sin(keep)).T / n
    return forward, grouped, inverse


def _front(stem: _Stem, transforms: tuple, n: int, windows: int) -> tuple[list, list]:
    """The new graph's nodes and initializers up to the first convolution's output (same name as before)."""
    from onnx import TensorProto, helper, numpy_helper

    forward, grouped, inverse = transforms
    k = n // 2 + 1
    out_ch, _, kh, kw = stem.weight.shape
    out_h, out_w = stem.out_hw
    height, width = stem.height, stem.width

    def init(name: str, value: ArrayLike, dtype=np.float32):
        return numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), _PREFIX + name)

    p = _PREFIX
    inits = [
        init("scale", stem.scale.reshape(1, 3, 1, 1)),
        init("shift", stem.shift.reshape(1, 3, 1, 1)),
        init("forward", forward),
        init("weight", grouped),
        init("inverse", inverse),
        init("flat", [n, 3 * height * width], np.int64),
        init("split", [2, k, 3, height, width], np.int64),
        init("stacked", [1, 6 * k, height, width], np.int64),
        init("rows", [2 * k, out_ch * out_h * out_w], np.int64),
        init("out", [windows, out_ch, out_h, out_w], np.int64),
    ]
    out_name = stem.nodes[-1].output[0]
    last = out_name if stem.bias is None else p + "unbiased"
    conv = helper.make_node(
        "Conv", [p + "stacked_spectrum", p + "weight"], [p + "products"], group=k, kernel_shape=[kh, kw], **stem.attrs
    )
    nodes = [
        helper.make_node("Cast", [FRAMES_INPUT], [p + "float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [p + "float", p + "scale"], [p + "scaled"]),
        helper.make_node("Add", [p + "scaled", p + "shift"], [p + "normal"]),
        helper.make_node("Reshape", [p + "normal", p + "flat"], [p + "flat_frames"]),
        helper.make_node("MatMul", [p + "forward", p + "flat_frames"], [p + "spectrum"]),
        helper.make_node("Reshape", [p + "spectrum", p + "split"], [p + "parts"]),
        helper.make_node("Transpose", [p + "parts"], [p + "by_frequency"], perm=[1, 0, 2, 3, 4]),
        helper.make_node("Reshape", [p + "by_frequency", p + "stacked"], [p + "stacked_spectrum"]),
        conv,
        helper.make_node("Reshape", [p + "products", p + "rows"], [p + "product_rows"]),
        helper.make_node("MatMul", [p + "inverse", p + "product_rows"], [p + "windows"]),
        helper.make_node("Reshape", [p + "windows", p + "out"], [last]),
    ]
    if stem.bias is not None:
        inits.append(init("bias", np.asarray(stem.bias).reshape(1, out_ch, 1, 1)))
        nodes.append(helper.make_node("Add", [last, p + "bias"], [out_name]))
    return nodes, inits


def sliding_window_graph(model, clip_length_frames: int, stride_frames: int, windows: int):
    """Rewrite a stacked-frame clip model so one run scores ``windows`` windows at consecutive frames.

    Args:
        model: The exported ``onnx.ModelProto`` (not changed).
        clip_length_frames: Frames per window, the model's ``T``.
        stride_frames: Gap between a window's frames (the sampling the model was trained with).
        windows: Windows per run (32 to 64 measured best: fewer convolutions per window against a
            larger inverse transform).

    Returns:
        ``(graph, SlidingWindows)``: the new ``onnx.ModelProto`` and what it takes and gives.

    Raises:
        SlidingStemError: The graph is not a stacked-frame model of that clip length (why).
    """
    import onnx
    from onnx import TensorProto, helper

    if windows < 1 or clip_length_frames < 1 or stride_frames < 1:
        raise ValueError(f"windows {windows}, clip_length_frames {clip_length_frames}, stride_frames {stride_frames}")
    graph = model.graph
    stem = _read_stem(graph, clip_length_frames)
    span = (clip_length_frames - 1) * stride_frames + 1
    n = windows + span - 1
    transforms = _transforms(stem.weight, clip_length_frames, stride_frames, n, windows)
    nodes, inits = _front(stem, transforms, n, windows)

    removed = {id(x) for x in stem.nodes}
    rest = [node for node in graph.node if id(node) not in removed]
    if stem.batch > 0:  # an export at one batch size: its later reshapes name that size (the flatten before fc)
        rest = [_unfixed_batch(graph, node, stem.batch, inits) for node in rest]
    used = {name for node in rest for name in node.input} | {o.name for o in graph.output}
    kept_inits = [i for i in graph.initializer if i.name in used]
    frames_in = helper.make_tensor_value_info(FRAMES_INPUT, TensorProto.UINT8, [n, 3, stem.height, stem.width])
    outputs = []
    for output in graph.output:
        dims = [d.dim_value or d.dim_param for d in output.type.tensor_type.shape.dim]
        shape = [windows, *dims[1:]] if dims else None
        outputs.append(helper.make_tensor_value_info(output.name, output.type.tensor_type.elem_type, shape))
    # value_info is left out: its shapes name the old batch dimension.
    new_graph = helper.make_graph(nodes + rest, graph.name + "_sliding", [frames_in], outputs, inits + kept_inits)
    new_model = helper.make_model(new_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    onnx.checker.check_model(new_model)
    return new_model, SlidingWindows(n, windows, span, stem.height, stem.width)
