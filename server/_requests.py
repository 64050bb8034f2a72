"""From a request body to validated batch items: the work done on parser threads, shared by the front ends.

The KServe path (:func:`kserve_items`) and the REST path (:func:`rest_items`) both inflate the
body (:func:`~gpufeed.server._http.decode_body`), parse it, check declared shapes against the
limits before converting data, and validate every image from its header; the handlers run them
on :class:`~gpufeed.server._offload.ParsePool` threads. A KServe JSON document over
:data:`~gpufeed.server._offload.INLINE_JSON_BYTES` is handed back unparsed, for the worker process.
Nothing here knows about HTTP beyond header values passed in as strings, so another front end
(gRPC) can take the same path.
"""

from __future__ import annotations

import math

from gpufeed.server._errors import RequestError, shown
from gpufeed.server._http import content_type_of, decode_body, parse_multipart
from gpufeed.server._inputs import items_from_images, items_from_kserve
from gpufeed.server._kserve import parse_request
from gpufeed.server._offload import INLINE_JSON_BYTES

__all__ = ["IMAGE_TYPES", "json_bytes_of", "kserve_items", "max_elements", "rest_items", "top_k_of"]

IMAGE_TYPES = ("image/jpeg", "image/jpg", "image/png")


def json_bytes_of(body: bytes, header_length: str | None) -> int:
    """How much of ``body`` is JSON: the Inference-Header-Content-Length, or all of it."""
    if header_length is None:
        return len(body)
    try:
        return min(len(body), max(0, int(header_length)))
    except ValueError:
        return 0  # refused by the parser, quickly


def kserve_items(model, cfg, body: bytes, encoding, header_length):
    """Inflate, parse and validate a KServe body (on a parser thread).

    Returns:
        ``(request, items)``; or ``(None, body)`` when the JSON is too large to parse on a thread
        (the caller hands the inflated body to the worker process).
    """
    body = decode_body(body, encoding, cfg.max_body_bytes)
    if json_bytes_of(body, header_length) > INLINE_JSON_BYTES:
        return None, body
    parsed = parse_request(body, header_length, max_elements(model, cfg))
    return parsed, items_from_kserve(model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)


def max_elements(model, cfg) -> int:
    """Most elements one input may declare: a full request of the model's decoded rows."""
    return cfg.max_images_per_request * max(1, math.prod(model.card.sample_shape))


def rest_items(model, cfg, body: bytes, encoding, content_type):
    """Inflate, split (multipart) and validate a REST body (on a parser thread)."""
    body = decode_body(body, encoding, cfg.max_body_bytes)
    kind, params = content_type_of(content_type)
    if kind in IMAGE_TYPES:
        blobs, where = [body], "the request body"
    elif kind == "multipart/form-data":
        every = parse_multipart(body, params.get("boundary"))
        parts = [p for p in every if p.filename is not None or p.content_type in IMAGE_TYPES]
        if not parts:
            raise RequestError("malformed_request", "the multipart body has no file part (an image)")
        blobs, where = [p.data for p in parts], "the multipart files"
    else:
        raise RequestError(
            "unsupported_media_type",
            f"Content-Type {shown(kind or '(none)', 80)} is not accepted; send image/jpeg, image/png or "
            "multipart/form-data",
        )
    return items_from_images(model, blobs, cfg.max_image_pixels, cfg.max_images_per_request, where)


def top_k_of(raw: str | None, default: int, num_classes: int) -> int:
    """The REST ``?top_k=`` value: ``default`` when absent, else an integer in [1, classes]."""
    if raw is None:
        return min(default, num_classes)
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(
            "malformed_request", f"query parameter top_k must be an integer, got {shown(raw, 40)}"
        ) from None
    if not 1 <= value <= num_classes:
        raise RequestError("malformed_request", f"query parameter top_k must be in [1, {num_classes}], got {value}")
    return value
