"""From a request to validated batch items: every check a request gets before anything is queued.

Both front ends come here. HTTP KServe bodies (:func:`kserve_items`) and REST bodies
(:func:`rest_items`) are inflated (:func:`~gpufeed.server._http.decode_body`), parsed, checked
against the limits by their declared shapes before any data is converted, and every image is
validated from its header; gRPC messages (:func:`grpc_items`) are converted by
:mod:`._grpc_tensors` and validated by the same :func:`items_from_kserve`. Each runs whole on one
:class:`~gpufeed.server._offload.ParsePool` thread (the data plane's
:meth:`~gpufeed.server._dataplane.Inference.validate`), but for a KServe JSON document over
:data:`~gpufeed.server._offload.INLINE_JSON_BYTES`, which is parsed in the pool's worker process
(:func:`kserve_items` says where each of its steps runs). Nothing here knows about HTTP beyond
header values passed in as strings.

Everything that can be checked without decoding pixels is checked here, per request, so a bad
image or tensor fails its own request with a 4xx and never reaches a batch.

KServe inputs a model accepts (``GET /v2/models/{name}`` lists them):

* ``image``: BYTES, shape ``[k]`` or ``[k, 1]``, encoded JPEG/PNG (models whose head accepts
  them: image and dense models): raw bytes
  (binary tensor data, gRPC), or base64 text (``parameters.content_type: "base64"``; a JSON string
  with no content type is read as base64 too, since UTF-8 text is never a JPEG or PNG);
* the model card's input name (``pixels``): UINT8, shape ``[k, *sample_shape]``, already decoded
  and cropped (``[k, 3, S, S]`` NCHW images, ``[k, 3, T, S, S]`` NCTHW clips).
"""

from __future__ import annotations

import math

import numpy as np

from gpufeed.models import ModelCard
from gpufeed.server._errors import RequestError, shown
from gpufeed.server._grpc_tensors import infer_request
from gpufeed.server._http import content_type_of, decode_body, parse_multipart
from gpufeed.server._items import Item
from gpufeed.server._kserve import InferRequest, decode_base64, parse_request
from gpufeed.server._model import ServedModel
from gpufeed.server._offload import INLINE_JSON_BYTES, ParsePool
from gpufeed.server._preprocess import inspect_image
from gpufeed.server._video import VIDEO_INPUT, VideoUpload, video_input_entry

__all__ = [
    "ENCODED_INPUT",
    "IMAGE_TYPES",
    "body_limit",
    "grpc_items",
    "items_from_images",
    "items_from_kserve",
    "json_bytes_of",
    "kserve_inputs",
    "kserve_items",
    "max_elements",
    "parse_kserve",
    "rest_items",
    "rest_video",
    "top_k_of",
    "video_upload",
]

ENCODED_INPUT = "image"
IMAGE_TYPES = ("image/jpeg", "image/jpg", "image/png")


def kserve_inputs(card: ModelCard) -> list[dict]:
    """A model's inputs in KServe model-metadata form (``-1``: any number of rows)."""
    inputs = [{"name": card.input_name, "datatype": "UINT8", "shape": [-1, *card.sample_shape]}]
    if card.spec.head.accepts_encoded:  # image and dense models also decode JPEG/PNG themselves
        inputs.insert(0, {"name": ENCODED_INPUT, "datatype": "BYTES", "shape": [-1, 1]})
    if card.spec.head.accepts_video:  # clip models decode a whole encoded video (server/_video.py)
        inputs.insert(0, video_input_entry())
    return inputs


def video_upload(model: ServedModel, request: InferRequest) -> VideoUpload | None:
    """The encoded video of a KServe request whose one input is ``video`` (clip models), else ``None``.

    Raises:
        RequestError: The input is not one BYTES element (``[1]`` or ``[1, 1]``), or its base64 is bad.
    """
    if len(request.inputs) != 1 or request.inputs[0].name != VIDEO_INPUT or not model.head.accepts_video:
        return None
    tensor = request.inputs[0]
    where = f"input '{VIDEO_INPUT}'"
    if tensor.datatype != "BYTES":
        raise RequestError("bad_dtype", f"{where} must be BYTES (one encoded video), got {tensor.datatype}")
    if tuple(tensor.shape) not in ((1,), (1, 1)) or len(tensor.elements or []) != 1:
        raise RequestError(
            "bad_shape", f"{where} holds one encoded video: shape [1] (or [1, 1]), got {list(tensor.shape)}"
        )
    blobs = tensor.elements or []
    if tensor.text:  # a JSON string with no content type: base64, as for images
        blobs = decode_base64(blobs, where)
    return VideoUpload(bytes(blobs[0]), where)


def _check_count(count: int, limit: int, where: str) -> None:
    if count == 0:
        raise RequestError("bad_shape", f"{where} holds no images or rows")
    if count > limit:
        raise RequestError(
            "bad_shape", f"{where} holds {count} images or rows; the limit is {limit} (serve.max_images_per_request)"
        )


def items_from_images(model: ServedModel, blobs: list[bytes], max_pixels: int, limit: int, where: str) -> list[Item]:
    """Validate encoded images (``where`` names them in errors, e.g. ``"input 'image'"``)."""
    if not model.head.accepts_encoded:
        video = (
            f", or one encoded video (a video/* body, KServe input '{VIDEO_INPUT}')" if model.head.accepts_video else ""
        )
        raise RequestError(
            "unsupported_media_type",
            f"model {model.name!r} is a {model.head.kind} model: it takes decoded UINT8 tensors "
            f"{[-1, *model.card.sample_shape]} as input {model.card.input_name!r} of POST /v2/models/{model.name}/infer"
            f"{video}",
        )
    _check_count(len(blobs), limit, where)
    items = []
    for i, blob in enumerate(blobs):
        label = f"image {i} of {where}" if len(blobs) > 1 else where
        info = inspect_image(blob, max_pixels, label)
        items.append(Item(encoded=blob, size=(info.width, info.height), where=label))
    return items


def items_from_kserve(
    model: ServedModel, request: InferRequest, max_pixels: int, limit: int
) -> list[Item] | VideoUpload:
    """Validate a parsed KServe request's single input into items (a clip model's video: its upload, checked later)."""
    card = model.card
    video = video_upload(model, request)
    if video is not None:
        return video
    allowed = [i["name"] for i in kserve_inputs(card)]
    if len(request.inputs) != 1:
        raise RequestError(
            "malformed_request",
            f"model {model.name!r} takes exactly one input (one of {allowed}), got {len(request.inputs)}",
        )
    tensor = request.inputs[0]
    where = f"input '{tensor.name}'"
    if tensor.name == ENCODED_INPUT and model.head.accepts_encoded:
        if tensor.datatype != "BYTES":
            raise RequestError("bad_dtype", f"{where} must be BYTES (encoded JPEG/PNG), got {tensor.datatype}")
        if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
            raise RequestError("bad_shape", f"{where} must have shape [k] or [k, 1], got {list(tensor.shape)}")
        blobs = tensor.elements or []  # a BYTES input always has its elements (the parsers set them)
        if tensor.text:  # JSON strings, no content type: the only image they can carry is base64
            try:
                blobs = decode_base64(blobs, where)
            except RequestError as err:
                raise RequestError(
                    "corrupt_image",
                    f"{err.message}; a JSON string carries an image as base64 (parameters.content_type "
                    "'base64'), or send the raw bytes with the binary tensor data extension",
                ) from None
        return items_from_images(model, blobs, max_pixels, limit, where)
    if tensor.name == card.input_name:
        expected = [-1, *card.sample_shape]
        if tensor.datatype != "UINT8":
            raise RequestError(
                "bad_dtype", f"{where} must be UINT8 pixels (the model normalises inside), got {tensor.datatype}"
            )
        if len(tensor.shape) != len(expected) or tuple(tensor.shape[1:]) != card.sample_shape:
            raise RequestError(
                "bad_shape", f"{where} must have shape {expected} ({card.spec.input_layout}), got {list(tensor.shape)}"
            )
        _check_count(tensor.shape[0], limit, where)
        rows = np.ascontiguousarray(tensor.array, dtype=np.uint8)
        return [Item(pixels=rows[k], where=f"row {k} of {where}") for k in range(len(rows))]
    if tensor.name == ENCODED_INPUT:
        raise RequestError(
            "bad_dtype",
            f"model {model.name!r} is a {model.head.kind} model: it takes UINT8 input {card.input_name!r} "
            f"{[-1, *card.sample_shape]}, not encoded images",
        )
    raise RequestError("malformed_request", f"model {model.name!r} has no input {tensor.name!r}; inputs: {allowed}")


def json_bytes_of(body: bytes, header_length: str | None) -> int:
    """How much of ``body`` is JSON: the Inference-Header-Content-Length, or all of it."""
    if header_length is None:
        return len(body)
    try:
        return min(len(body), max(0, int(header_length)))
    except ValueError:
        return 0  # refused by the parser, quickly


def max_elements(model: ServedModel, cfg) -> int:
    """Most elements one input may declare: a full request of the model's decoded rows."""
    return cfg.max_images_per_request * max(1, math.prod(model.card.sample_shape))


async def kserve_items(
    pool: ParsePool, model: ServedModel, cfg, body: bytes, encoding: str | None, header_length: str | None
) -> tuple[InferRequest, list[Item] | VideoUpload]:
    """Inflate, parse and validate a KServe HTTP body, each step where it belongs (awaited on the event loop).

    A document of up to :data:`~gpufeed.server._offload.INLINE_JSON_BYTES` of JSON is parsed and
    validated on one parser thread (:func:`parse_kserve`); a larger one is parsed in the pool's
    worker process, holding no parser thread while it waits (so a flood of large bodies slows
    their own parsing, not everyone else's), then validated on a thread. A compressed body is
    inflated on a thread first: its JSON size is known only then.

    Returns:
        The parsed request (its requested outputs, id, parameters) and its validated items.
    """
    if (encoding or "identity").strip().lower() != "identity":
        body = await pool.run(decode_body, body, encoding, cfg.max_body_bytes)
    if json_bytes_of(body, header_length) <= INLINE_JSON_BYTES:
        return await pool.run(parse_kserve, model, cfg, body, header_length)
    parsed = await pool.run_isolated(parse_request, body, header_length, max_elements(model, cfg))
    items = await pool.run(items_from_kserve, model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)
    return parsed, items


def parse_kserve(
    model: ServedModel, cfg, body: bytes, header_length: str | None
) -> tuple[InferRequest, list[Item] | VideoUpload]:
    """Parse and validate an inflated KServe body (on a parser thread)."""
    parsed = parse_request(body, header_length, max_elements(model, cfg))
    return parsed, items_from_kserve(model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)


def grpc_items(model: ServedModel, cfg, message) -> tuple[InferRequest, list[Item] | VideoUpload]:
    """Convert and validate a gRPC ``ModelInferRequest`` (on a parser thread): the HTTP side's checks."""
    parsed = infer_request(message, max_elements(model, cfg))
    return parsed, items_from_kserve(model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)


def rest_items(
    model: ServedModel, cfg, body: bytes, encoding: str | None, content_type: str | None, one_map: bool = False
) -> list[Item]:
    """Inflate, split (multipart) and validate a REST body (on a parser thread).

    Args:
        one_map: The answer is one PNG map (a dense model asked for ``Accept: image/png``), so the
            body must hold exactly one image.
    """
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
        # A clip model's REST body is a video (server/_app.py routes video/* before this), so naming
        # image types would send its caller the wrong way (curl's default type lands here).
        wanted = (
            f"model {model.name!r} is a {model.head.kind} model: send one encoded video as a video/* body "
            "(video/mp4, video/x-msvideo, video/webm, video/x-matroska, video/quicktime)"
            if model.head.accepts_video
            else "send image/jpeg, image/png or multipart/form-data"
        )
        raise RequestError(
            "unsupported_media_type", f"Content-Type {shown(kind or '(none)', 80)} is not accepted; {wanted}"
        )
    items = items_from_images(model, blobs, cfg.max_image_pixels, cfg.max_images_per_request, where)
    if one_map and len(items) != 1:
        raise RequestError(
            "malformed_request",
            f"an image/png answer holds one map: send one image, not {len(items)}, or accept application/json",
        )
    return items


def rest_video(model: ServedModel, cfg, body: bytes, encoding: str | None) -> VideoUpload:
    """A REST ``video/*`` body (inflated if it came compressed) as a clip model's upload (on a parser thread)."""
    return VideoUpload(decode_body(body, encoding, cfg.max_video_bytes), "the request body")


def body_limit(model: ServedModel, cfg) -> tuple[int, str]:
    """The most bytes a request body to ``model`` may hold, and the setting that says so.

    A clip model's bodies may carry a whole video (``serve.max_video_bytes``); the others'
    ``serve.max_body_bytes``.
    """
    if model.head.accepts_video and cfg.max_video_bytes > cfg.max_body_bytes:
        return cfg.max_video_bytes, "serve.max_video_bytes"
    return cfg.max_body_bytes, "serve.max_body_bytes"


def top_k_of(raw: str | None, default: int, num_classes: int) -> int:
    """The REST ``?top_k=`` value: ``default`` when absent, else an integer >= 1; either is capped at
    the model's classes, so one client's ``?top_k=5`` fits every model."""
    if raw is None:
        return min(default, num_classes)
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(
            "malformed_request", f"query parameter top_k must be an integer, got {shown(raw, 40)}"
        ) from None
    if value < 1:
        raise RequestError("malformed_request", f"query parameter top_k must be at least 1, got {value}")
    return min(value, num_classes)
