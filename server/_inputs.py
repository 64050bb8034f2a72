"""Turning a request's inputs into validated batch items, before anything is queued.

Everything that can be checked without decoding pixels is checked here, per request, so a bad
image or tensor fails its own request with a 4xx and never reaches a batch.

KServe inputs a model accepts (``GET /v2/models/{name}`` lists them):

* ``image``: BYTES, shape ``[k]`` or ``[k, 1]``, encoded JPEG/PNG (image models only): raw bytes
  (binary tensor data, gRPC), or base64 text (``parameters.content_type: "base64"``; a JSON string
  with no content type is read as base64 too, since UTF-8 text is never a JPEG or PNG);
* the model card's input name (``pixels``): UINT8, shape ``[k, *sample_shape]``, already decoded
  and cropped (``[k, 3, S, S]`` NCHW images, ``[k, 3, T, S, S]`` NCTHW clips).
"""

from __future__ import annotations

import numpy as np

from gpufeed.models import ModelCard
from gpufeed.server._errors import RequestError
from gpufeed.server._kserve import InferRequest, decode_base64
from gpufeed.server._model import Item, ServedModel
from gpufeed.server._preprocess import inspect_image

__all__ = ["ENCODED_INPUT", "items_from_images", "items_from_kserve", "kserve_inputs"]

ENCODED_INPUT = "image"


def kserve_inputs(card: ModelCard) -> list[dict]:
    """A model's inputs in KServe model-metadata form (``-1``: any number of rows)."""
    inputs = [{"name": card.input_name, "datatype": "UINT8", "shape": [-1, *card.sample_shape]}]
    if card.spec.task != "clip":  # image and dense models also decode JPEG/PNG themselves
        inputs.insert(0, {"name": ENCODED_INPUT, "datatype": "BYTES", "shape": [-1, 1]})
    return inputs


def _check_count(count: int, limit: int, where: str) -> None:
    if count == 0:
        raise RequestError("bad_shape", f"{where} holds no images or rows")
    if count > limit:
        raise RequestError(
            "bad_shape", f"{where} holds {count} images or rows; the limit is {limit} (serve.max_images_per_request)"
        )


def items_from_images(model: ServedModel, blobs: list[bytes], max_pixels: int, limit: int, where: str) -> list[Item]:
    """Validate encoded images (``where`` names them in errors, e.g. ``"input 'image'"``)."""
    if not model.accepts_encoded:
        raise RequestError(
            "unsupported_media_type",
            f"model {model.name!r} is a clip model: it takes decoded UINT8 tensors "
            f"{[-1, *model.card.sample_shape]} as input {model.card.input_name!r} of POST /v2/models/{model.name}/infer",
        )
    _check_count(len(blobs), limit, where)
    items = []
    for i, blob in enumerate(blobs):
        label = f"image {i} of {where}" if len(blobs) > 1 else where
        info = inspect_image(blob, max_pixels, label)
        items.append(Item(encoded=blob, size=(info.width, info.height), where=label))
    return items


def items_from_kserve(model: ServedModel, request: InferRequest, max_pixels: int, limit: int) -> list[Item]:
    """Validate a parsed KServe request's single input into items."""
    card = model.card
    allowed = [i["name"] for i in kserve_inputs(card)]
    if len(request.inputs) != 1:
        raise RequestError(
            "malformed_request",
            f"model {model.name!r} takes exactly one input (one of {allowed}), got {len(request.inputs)}",
        )
    tensor = request.inputs[0]
    where = f"input '{tensor.name}'"
    if tensor.name == ENCODED_INPUT and model.accepts_encoded:
        if tensor.datatype != "BYTES":
            raise RequestError("bad_dtype", f"{where} must be BYTES (encoded JPEG/PNG), got {tensor.datatype}")
        if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
            raise RequestError("bad_shape", f"{where} must have shape [k] or [k, 1], got {list(tensor.shape)}")
        blobs = tensor.elements
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
            f"model {model.name!r} is a clip model: it takes UINT8 input {card.input_name!r} "
            f"{[-1, *card.sample_shape]}, not encoded images",
        )
    raise RequestError("malformed_request", f"model {model.name!r} has no input {tensor.name!r}; inputs: {allowed}")
