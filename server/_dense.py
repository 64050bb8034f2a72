"""The REST answers of dense models (depth, segmentation): PNG maps and JSON, at the model's or the input's size.

The head (:class:`~gpufeed.models.DenseHead`) says what a map holds (:meth:`~gpufeed.models.DenseHead.map_values`:
16-bit depth codes that never take the no-data value, or 8-bit class ids), how it is resized and
what a reader needs beside it; this module places it and writes it out. Over KServe (HTTP or gRPC)
a dense model answers its head's output tensors, as every model does.

==============  ===========================================
task            REST ``Accept: image/png``
==============  ===========================================
depth           16-bit grayscale PNG of ``depth / depth_scale``: the training maps' values
segmentation    8-bit grayscale PNG of the argmax class ids
==============  ===========================================

The model sees the evaluation crop of the image (:func:`gpufeed.pipelines._windows.eval_windows`),
so its map covers that window. ``?size=model`` answers the map as the model made it (H x W of
the model's input); ``?size=input`` (the default) places it back at the input image's own size
(EXIF orientation applied): resized to the window (:meth:`~gpufeed.models.DenseHead.resize_map`) and
written into a canvas of the input's size whose pixels outside the window hold the model's
"nothing here" value (``data.depth_no_data`` or ``data.mask_ignore_id`` of its training).

**JSON answers** hold one number per map pixel; one that would hold more than
``serve.max_json_map_pixels`` values in all (a large photo at ``?size=input``) is refused
(``400``, reason ``too_many_pixels``) before inference, naming the PNG answer and ``?size=model``.
The JSON text is written by :func:`gpufeed.server._map_json.int_map_json`, no Python object per value.
"""

from __future__ import annotations

import io

import numpy as np

from gpufeed.models import DenseHead
from gpufeed.pipelines import eval_windows
from gpufeed.server._errors import RequestError, json_bytes, shown
from gpufeed.server._map_json import int_map_json

__all__ = [
    "MAP_SIZES",
    "check_json_map_pixels",
    "dense_json",
    "dense_map",
    "dense_png",
    "map_pixels",
    "map_size_of",
    "wants_png",
]

MAP_SIZES = ("input", "model")


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


def _head(spec) -> DenseHead:
    head = spec.head
    if not isinstance(head, DenseHead):
        raise TypeError(f"model {spec.name!r} is a {head.kind} model: it answers no maps")
    return head


def _at_input_size(values: np.ndarray, spec, size: tuple[int, int]) -> np.ndarray:
    """``values`` resized to the model's crop window in the input and placed on an input-sized canvas."""
    aspect = spec.size_px.width_px / spec.size_px.height_px
    window = eval_windows(np.array([size], dtype=np.int64), spec.eval_crop_fraction, aspect)
    (x, y), (w, h) = window.anchor[0], window.shape[0]
    resized = _head(spec).resize_map(values, int(w), int(h))
    canvas = np.full((size[1], size[0]), spec.map_fill, dtype=values.dtype)
    canvas[y : y + h, x : x + w] = resized
    return canvas


def dense_map(row: np.ndarray, spec, size: tuple[int, int], where: str) -> np.ndarray:
    """The map of one output row ``(C, H, W)`` at the model's size, or at the input's ``size`` (width, height)."""
    values = _head(spec).map_values(row)
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
    model = (spec.size_px.width_px, spec.size_px.height_px)
    return sum(w * h for w, h in (size if size and where == "input" else model for size in sizes))


def check_json_map_pixels(spec, sizes, where: str, limit: int) -> None:
    """Refuse a JSON answer whose maps would hold more than ``limit`` values in all (before inference).

    Raises:
        RequestError: ``too_many_pixels`` (400), naming the sizes, the limit's key and the compact answers.
    """
    total = map_pixels(spec, sizes, where)
    if total > limit:
        width, height = sizes[0] if sizes[0] and where == "input" else (spec.size_px.width_px, spec.size_px.height_px)
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
    dense = _head(spec)
    key = dense.map_key
    opening = json_bytes({"model": model_name, "task": spec.task, "size": where, **dense.map_facts()})
    parts = [opening[:-1], b',"predictions":[']
    for i, (row, size) in enumerate(zip(logits, sizes, strict=True)):
        values = dense_map(row, spec, size, where)
        facts = json_bytes({"image": i, "width": int(values.shape[1]), "height": int(values.shape[0])})
        parts += [b"," if i else b"", facts[:-1], f',"{key}":'.encode(), int_map_json(values), b"}"]
    parts.append(b"]}")
    return b"".join(parts)
