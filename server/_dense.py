"""Answers of dense models (depth, segmentation): KServe tensors, PNG maps and JSON.

==============  ===========================================  =======================================
task            KServe v2 outputs (FP32)                     REST ``Accept: image/png``
==============  ===========================================  =======================================
depth           ``depth`` ``[N, H, W]`` in the training      16-bit grayscale PNG of ``depth /
                target's unit                                depth_scale``: the training maps' values
segmentation    ``scores`` ``[N, C, H, W]`` (softmax over    8-bit grayscale PNG of the argmax class
                C) and ``logits`` ``[N, C, H, W]``           ids
==============  ===========================================  =======================================

The model sees the evaluation crop of the image (:func:`gpufeed.pipelines._windows.eval_windows`),
so its map covers that window. ``?size=model`` answers the map as the model made it (H x W of
the model's input); ``?size=input`` (the default) places it back at the input image's own size
(EXIF orientation applied): resized to the window (nearest for masks, window pixel u taking map
pixel ``floor((u + 0.5) * model / window)``; bilinear for depth) and
written into a canvas of the input's size whose pixels outside the window hold the model's
"nothing here" value (``data.depth_no_data`` or ``data.mask_ignore_id`` of its training).
"""

from __future__ import annotations

import io

import numpy as np

from gpufeed.pipelines._windows import eval_windows
from gpufeed.server._errors import RequestError, shown
from gpufeed.server._model import scores_from_logits

__all__ = [
    "MAP_SIZES",
    "dense_document",
    "dense_map",
    "dense_png",
    "dense_tensors",
    "map_size_of",
    "output_metadata",
    "output_tensors",
    "wants_png",
]

MAP_SIZES = ("input", "model")


def dense_tensors(logits: np.ndarray, spec) -> dict[str, np.ndarray]:
    """The KServe output tensors of a dense model's ``(N, C, H, W)`` logits (see the module docs)."""
    logits = np.asarray(logits, dtype=np.float32)
    if spec.task == "depth":
        return {"depth": logits[:, 0]}
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"scores": (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32), "logits": logits}


def output_tensors(logits: np.ndarray, spec, requested=()) -> dict[str, np.ndarray]:
    """Every model's KServe output tensors: a classifier's ``logits`` and ``scores``, or a dense model's maps.

    Args:
        requested: The request's outputs (KServe ``outputs``); a dense model refuses the
            ``classification`` extension on any of them.
    """
    if not spec.is_dense:
        return {"logits": logits, "scores": scores_from_logits(logits, spec.multilabel)}
    if any(getattr(out, "classification", None) for out in requested or ()):
        raise RequestError("malformed_request", f"a {spec.task} model answers maps: it has no classification output")
    return dense_tensors(logits, spec)


def output_metadata(spec) -> list[tuple[str, list[int]]]:
    """``(name, shape)`` of each KServe output (``-1``: any number of rows), for the metadata routes."""
    if not spec.is_dense:
        return [(name, [-1, spec.num_classes]) for name in ("logits", "scores")]
    shape = list(spec.output_shape(-1))
    if spec.task == "depth":
        return [("depth", [shape[0], *shape[2:]])]
    return [("scores", shape), ("logits", shape)]


def wants_png(accept: str | None) -> bool:
    """Whether the request's ``Accept`` header asks for ``image/png`` (over JSON)."""
    return accept is not None and "image/png" in accept.lower()


def map_size_of(raw: str | None) -> str:
    """The ``?size=`` query value: ``input`` (default) or ``model``."""
    value = raw or "input"
    if value not in MAP_SIZES:
        raise RequestError(
            "malformed_request", f"query parameter size must be one of {list(MAP_SIZES)}, got {shown(value, 40)}"
        )
    return value


def _map_values(row: np.ndarray, spec) -> np.ndarray:
    """One output row as the map's stored values: uint16 depth in map units, or uint8 class ids."""
    if spec.task == "depth":
        return np.clip(np.rint(row[0] / spec.depth_scale), 0, 65535).astype(np.uint16)
    return row.argmax(axis=0).astype(np.uint8)


def _at_input_size(values: np.ndarray, spec, size: tuple[int, int]) -> np.ndarray:
    """``values`` resized to the model's crop window in the input and placed on an input-sized canvas."""
    from PIL import Image

    aspect = spec.size.width_px / spec.size.height_px
    window = eval_windows(np.array([size], dtype=np.int64), spec.eval_crop_fraction, aspect)
    (x, y), (w, h) = window.anchor[0], window.shape[0]
    if spec.task == "depth":  # bilinear in float, then back to the map's integer values
        resized = np.asarray(
            Image.fromarray(values.astype(np.float32), mode="F").resize((w, h), Image.Resampling.BILINEAR)
        )
        resized = np.clip(np.rint(resized), 0, 65535).astype(values.dtype)
    else:  # class ids: nearest, never a blend of two ids; output pixel u takes floor((u + 0.5) * in / out)
        rows = ((2 * np.arange(h) + 1) * values.shape[0]) // (2 * h)
        cols = ((2 * np.arange(w) + 1) * values.shape[1]) // (2 * w)
        resized = values[np.ix_(rows, cols)]
    canvas = np.full((size[1], size[0]), spec.map_fill, dtype=values.dtype)
    canvas[y : y + h, x : x + w] = resized
    return canvas


def dense_map(row: np.ndarray, spec, size: tuple[int, int], where: str) -> np.ndarray:
    """The map of one output row at the model's size, or at the input's ``size`` (width, height)."""
    values = _map_values(row, spec)
    return values if where == "model" else _at_input_size(values, spec, size)


def dense_png(row: np.ndarray, spec, size: tuple[int, int], where: str) -> bytes:
    """One output row as a PNG: 16-bit depth or 8-bit class ids (see the module docs)."""
    from PIL import Image

    values = dense_map(row, spec, size, where)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")  # uint16 -> mode I;16: a 16-bit grayscale PNG
    return buffer.getvalue()


def dense_document(model_name: str, logits: np.ndarray, spec, sizes: list[tuple[int, int]], where: str) -> dict:
    """The REST JSON answer: per image its map (rows of values) at the asked size."""
    key = "depth" if spec.task == "depth" else "mask"
    predictions = []
    for i, (row, size) in enumerate(zip(logits, sizes, strict=True)):
        values = dense_map(row, spec, size, where)
        predictions.append(
            {"image": i, "width": int(values.shape[1]), "height": int(values.shape[0]), key: values.tolist()}
        )
    unit = {"depth_scale": spec.depth_scale} if spec.task == "depth" else {"labels": list(spec.labels)}
    return {"model": model_name, "task": spec.task, "size": where, **unit, "predictions": predictions}
