"""Answers of dense models (depth, segmentation): KServe tensors, PNG maps and JSON.

==============  ===========================================  =======================================
task            KServe v2 outputs (FP32)                     REST ``Accept: image/png``
==============  ===========================================  =======================================
depth           ``depth`` ``[N, H, W]`` in the training      16-bit grayscale PNG of ``depth /
                target's unit                                depth_scale``: the training maps' values,
                                                             never the no-data value (below)
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

**Depth codes.** A depth map's values are ``round(depth / depth_scale)`` clipped to 0..65535,
and the no-data value (``data.depth_no_data``, 0 unless set) means "not measured". A prediction
never takes it (:func:`depth_codes`): one that would is written as the next code away from it
(towards the prediction; inwards at the ends of the range), so with no-data 0 every negative
or sub-half-unit prediction reads 1, the smallest measured depth; a NaN prediction reads no-data.
A reader can take 0 (the no-data value) as "outside the model's window or no prediction" and
every other code as a prediction. The KServe ``depth`` tensor is the model's raw output,
negative values included.

**JSON answers** hold one number per map pixel; one that would hold more than
``serve.max_json_map_pixels`` values in all (a large photo at ``?size=input``) is refused
(``400``, reason ``too_many_pixels``) before inference, naming the PNG answer and ``?size=model``.
The JSON text is written by :func:`gpufeed.server._map_json.int_map_json`, no Python object per value.
"""

from __future__ import annotations

import io

import numpy as np

from gpufeed.pipelines._windows import eval_windows
from gpufeed.server._errors import RequestError, json_bytes, shown
from gpufeed.server._map_json import int_map_json
from gpufeed.server._model import scores_from_logits

__all__ = [
    "MAP_SIZES",
    "check_json_map_pixels",
    "dense_json",
    "dense_map",
    "dense_png",
    "dense_tensors",
    "depth_codes",
    "map_pixels",
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


def depth_codes(depth_units: np.ndarray, no_data: int) -> np.ndarray:
    """Depth in map units (``depth / depth_scale``) as uint16 map codes that never equal ``no_data``.

    ``round`` and clip to 0..65535; a code equal to ``no_data`` moves one code away from it,
    towards the prediction (up at 0, down at 65535); NaN becomes ``no_data`` (see the module docs).
    """
    units = np.asarray(depth_units, dtype=np.float32)
    # No-data at an end of the range (0, the default, or 65535): the clip's range leaves it out, in one pass.
    low, high = (1, 65535) if no_data == 0 else (0, 65534) if no_data == 65535 else (0, 65535)
    codes = np.rint(units)
    np.clip(codes, low, high, out=codes)
    if low == 0 and high == 65535:
        hit = codes == no_data
        if hit.any():
            codes[hit] = np.where(units[hit] >= no_data, no_data + 1, no_data - 1)
    nan = np.isnan(units)
    if nan.any():
        codes[nan] = no_data
    return codes.astype(np.uint16)


def _map_values(row: np.ndarray, spec) -> np.ndarray:
    """One output row as the map's stored values: uint16 depth codes in map units, or uint8 class ids."""
    if spec.task == "depth":
        return depth_codes(row[0] / spec.depth_scale, spec.map_fill)
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
        resized = depth_codes(resized, spec.map_fill)  # a blend of two codes never lands on no-data
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


def map_pixels(spec, sizes, where: str) -> int:
    """The values the maps of an answer hold in all: each image's (width, height) at ``?size=input``
    (an image without a size counts at the model's), the model's size at ``?size=model``."""
    model = (spec.size.width_px, spec.size.height_px)
    return sum(w * h for w, h in (size if size and where == "input" else model for size in sizes))


def check_json_map_pixels(spec, sizes, where: str, limit: int) -> None:
    """Refuse a JSON answer whose maps would hold more than ``limit`` values in all (before inference).

    Raises:
        RequestError: ``too_many_pixels`` (400), naming the sizes, the limit's key and the compact answers.
    """
    total = map_pixels(spec, sizes, where)
    if total > limit:
        width, height = sizes[0] if sizes[0] and where == "input" else (spec.size.width_px, spec.size.height_px)
        first = f"{width}x{height}" + (f" and {len(sizes) - 1} more" if len(sizes) > 1 else "")
        raise RequestError(
            "too_many_pixels",
            f"a JSON answer of {total:,} map values ({first} at ?size={where}) is above the limit of {limit:,} "
            "(serve.max_json_map_pixels); ask for 'Accept: image/png' (a compact PNG map per request) or ?size=model",
        )


def dense_json(model_name: str, logits: np.ndarray, spec, sizes: list[tuple[int, int]], where: str) -> bytes:
    """The REST JSON answer, as bytes: per image its map (rows of values) at the asked size.

    ``{"model", "task", "size", "depth_scale" | "labels", "predictions": [{"image", "width",
    "height", "depth" | "mask": [[...], ...]}, ...]}``; each map's text comes from
    :func:`~gpufeed.server._map_json.int_map_json`.
    """
    key = "depth" if spec.task == "depth" else "mask"
    unit = {"depth_scale": spec.depth_scale} if spec.task == "depth" else {"labels": list(spec.labels)}
    head = json_bytes({"model": model_name, "task": spec.task, "size": where, **unit})
    parts = [head[:-1], b',"predictions":[']
    for i, (row, size) in enumerate(zip(logits, sizes, strict=True)):
        values = dense_map(row, spec, size, where)
        facts = json_bytes({"image": i, "width": int(values.shape[1]), "height": int(values.shape[0])})
        parts += [b"," if i else b"", facts[:-1], f',"{key}":'.encode(), int_map_json(values), b"}"]
    parts.append(b"]}")
    return b"".join(parts)
