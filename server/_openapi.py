"""The server's own OpenAPI 3.0 description, served at ``GET /openapi.json``.

Written out by hand from the routes in :mod:`gpufeed.server._app` (the app is plain Starlette, so
nothing generates it), for the served models: path parameter ``name`` lists them, so a client or a
fuzzer (schemathesis, in the tests) reaches the real endpoints rather than 404s. Request bodies
are described as the handlers read them: KServe v2 JSON inference requests (or the binary tensor
extension, ``application/octet-stream`` with ``Inference-Header-Content-Length``), REST image
bodies (``image/jpeg``, ``image/png``, ``multipart/form-data`` with an ``image`` file) and a clip
model's ``video/mp4`` body, either
possibly compressed (``Content-Encoding: gzip`` or ``deflate``). Triton's extensions are
described too: model configuration, statistics, the repository index (load and unload are
declared as what they are: refused). Every refusal is declared with its status and the JSON
error body, so a response the document does not allow is a bug one side or the other.
"""

from __future__ import annotations

from typing import Any

from gpufeed.server._kserve import DTYPES
from gpufeed.server._openapi_schemas import REF as _REF
from gpufeed.server._openapi_schemas import schemas as _schemas

__all__ = ["openapi_document"]

_ERROR_STATUSES = {
    "400": "the request is malformed: bad JSON, shape, dtype, image data or parameter (reason says which)",
    "404": "no such model (or version)",
    "408": "the request body did not arrive within serve.request_timeout_seconds",
    "413": "the body, or its decompressed content, is larger than serve.max_body_bytes (a clip model's: "
    "serve.max_video_bytes)",
    "415": "the content type, content coding or image format is not accepted",
    "503": "the queue is full (Retry-After) or the server is loading or draining",
    "504": "no answer within serve.request_timeout_seconds",
}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _ref(name: str) -> dict:
    return {"$ref": _REF + name}


def _errors(codes: tuple[str, ...], auth: bool) -> dict:
    out = {code: {"description": _ERROR_STATUSES[code], "content": _json(_ref("Error"))} for code in codes}
    if auth:
        out["401"] = {
            "description": "missing or wrong bearer token (WWW-Authenticate: Bearer)",
            "content": _json(_ref("Error")),
        }
    return out


def openapi_document(model_names: list[str], version: str, auth: bool) -> dict:
    """The OpenAPI 3.0.3 document for a server serving ``model_names``.

    Args:
        model_names: Served model names (the ``name`` path parameter's values).
        version: gpufeed's version.
        auth: Whether a bearer token is required (adds the security scheme and 401 responses).
    """
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": list(model_names)}}
    version_param = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "enum": ["1"]}}
    open_op: dict[str, list] = {"security": []} if auth else {}

    def get(summary: str, schema: str, codes: tuple[str, ...] = (), params=(), ok_codes=("200",), public=False):
        responses = {code: {"description": summary, "content": _json(_ref(schema))} for code in ok_codes}
        responses.update(_errors(codes, auth and not public))
        op = {"summary": summary, "responses": responses, **(open_op if public else {})}
        if params:
            op["parameters"] = list(params)
        return {"get": op}

    infer_body = {
        "required": True,
        "content": {
            **_json(_ref("InferRequest")),
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "binary tensor extension: a JSON header of Inference-Header-Content-Length bytes, "
                "then each input's binary_data_size bytes",
            },
        },
    }
    infer_responses = {
        "200": {
            "description": "outputs logits and scores, FP32 [k, classes]",
            "content": {**_json(_ref("InferResponse")), "application/octet-stream": {"schema": {"type": "string"}}},
        },
        **_errors(tuple(_ERROR_STATUSES), auth),
    }
    header = {
        "name": "Inference-Header-Content-Length",
        "in": "header",
        "required": False,
        "schema": {"type": "integer", "minimum": 1},
    }
    codings = [
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "description": "the body compressed (tritonclient's request_compression_algorithm)",
            "schema": {"type": "string", "enum": ["identity", "gzip", "deflate"]},
        },
        {
            "name": "Accept-Encoding",
            "in": "header",
            "required": False,
            "description": "a 200 answer compressed (tritonclient's response_compression_algorithm)",
            "schema": {"type": "string", "enum": ["identity", "gzip", "deflate"]},
        },
    ]

    def infer(params):
        return {
            "post": {
                "summary": "KServe v2 inference: input 'image' (BYTES, encoded JPEG/PNG) or 'pixels' (UINT8)",
                "parameters": [*params, header, *codings],
                "requestBody": infer_body,
                "responses": infer_responses,
            }
        }

    image = {"schema": {"type": "string", "format": "binary"}}
    predict = {
        "post": {
            "summary": "classify an image: raw image/jpeg or image/png body, or multipart/form-data files; "
            "a clip model: a video/* body (mp4, avi, mkv/webm), scored per frame",
            "parameters": [
                name,
                {"name": "top_k", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
                {"name": "hop_frames", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
                {"name": "windows", "in": "query", "required": False, "schema": {"type": "boolean"}},
                *codings,
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "image/jpeg": image,
                    "image/png": image,
                    "video/mp4": image,
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": ["image"],
                            "properties": {"image": {"type": "string", "format": "binary"}},
                        }
                    },
                },
            },
            "responses": {
                "200": {
                    "description": "top-k labels and scores per image; a clip model's video: scores per frame",
                    "content": _json({"oneOf": [_ref("Predictions"), _ref("VideoScores")]}),
                },
                **_errors(tuple(_ERROR_STATUSES), auth),
            },
        }
    }

    def post(summary: str, schema: str, body: dict | None, codes: tuple[str, ...], params=(), ok_codes=("200",)):
        responses = {code: {"description": summary, "content": _json(_ref(schema))} for code in ok_codes}
        responses.update(_errors(codes, auth))
        op = {"summary": summary, "responses": responses}
        if params:
            op["parameters"] = list(params)
        if body is not None:
            op["requestBody"] = body
        return {"post": op}

    index_body = {"required": False, "content": _json(_ref("RepositoryIndexRequest"))}
    control = post("models are loaded when the server starts: always 400", "Error", None, (), [name], ("400",))
    paths = {
        "/v2/health/live": get("the process serves HTTP", "Live", public=True),
        "/v2/health/ready": get("every model loaded and warmed up", "Ready", ok_codes=("200", "400"), public=True),
        "/v2": get("server metadata", "ServerMetadata"),
        "/v2/models/stats": get("inference statistics of every model (Triton)", "ModelStats"),
        "/v2/repository/index": post(
            "the served models and their state (Triton)", "RepositoryIndex", index_body, ("400", "408", "413")
        ),
        "/v2/repository/models/{name}/load": control,
        "/v2/repository/models/{name}/unload": control,
    }
    for base, params in (
        ("/v2/models/{name}", [name]),
        ("/v2/models/{name}/versions/{version}", [name, version_param]),
    ):
        paths[base] = get("model metadata", "ModelMetadata", ("404",), params)
        paths[base + "/ready"] = get("model readiness", "ModelReady", ("404",), params, ok_codes=("200", "400"))
        paths[base + "/config"] = get("model configuration (Triton)", "ModelConfig", ("404",), params)
        paths[base + "/stats"] = get("inference statistics (Triton)", "ModelStats", ("404",), params)
        paths[base + "/infer"] = infer(params)
    paths.update(
        {
            "/v1/models": get("the served models", "ModelList"),
            "/v1/models/{name}/predict": predict,
            "/metrics": {
                "get": {
                    "summary": "Prometheus text exposition",
                    "responses": {
                        "200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                        **_errors((), auth),
                    },
                }
            },
        }
    )
    components: dict[str, dict] = {"schemas": _schemas(["BYTES", *DTYPES])}
    document: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "gpufeed inference server",
            "version": version,
            "description": "KServe v2 (Open Inference Protocol) and a simple REST endpoint for models exported "
            "by gpufeed export. Errors are JSON {error, reason}.",
        },
        "paths": paths,
        "components": components,
    }
    if auth:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
