"""The ASGI app (Starlette, run by uvicorn): KServe v2 with Triton's extensions, simple REST, health, /metrics.

=============================================  ====================================================
route                                          answers
=============================================  ====================================================
GET  /v2/health/live                           200 while the process serves HTTP
GET  /v2/health/ready                          200 once every model is loaded and warmed up, else 400
GET  /v2                                       server metadata and extensions
GET  /v2/models/{name}[/versions/1]            model metadata: the inputs a request may send, outputs
GET  /v2/models/{name}[/versions/1]/ready      200 ready, 400 loading or draining, 404 unknown
GET  /v2/models/{name}[/versions/1]/config     Triton's model configuration (:mod:`._triton`)
GET  /v2/models[/{name}[/versions/1]]/stats    Triton's inference statistics (:mod:`._stats`)
POST /v2/repository/index                      the served models and their state
POST /v2/models/{name}[/versions/1]/infer      KServe v2 inference (JSON or binary tensors, gzip/deflate)
GET  /v1/models                                the served models
POST /v1/models/{name}/predict                 an image body (image/jpeg, image/png) or multipart/form-data
                                               files -> top-k labels and scores as JSON; a clip model's
                                               video/* body -> per-frame scores (server/_video.py)
GET  /metrics                                  Prometheus text format
GET  /openapi.json                             this API as OpenAPI 3.0 (for clients and the fuzzing tests)
=============================================  ====================================================

Health answers follow the KServe v2 protocol: 200 for true, a 4xx (400, as Triton) for false.
The handlers are module-level functions that only translate HTTP: they find the
:class:`~gpufeed.server._dataplane.DataPlane` in ``request.app.state.plane`` and ask it for
everything else (inference, readiness, metadata, configuration, statistics), as the gRPC front
does. Bodies are read with the limits of :mod:`._http` and turned into batch items by
:mod:`._requests` on :class:`._offload.ParsePool` threads, never on the event loop. Every refusal is a JSON ``{"error", "reason"}`` counted by
reason (one handler for :class:`RequestError` on every route; 404/405 included); every answer to
an inference path is counted and timed by :class:`._accounting.Accounting`, which also turns
anything unexpected into a JSON 500. With a bearer token configured, every route but the two
health probes needs it (:mod:`._access`). The app is one front of the server, beside gRPC
(:mod:`._grpc`): both are started, over one data plane, by :class:`~gpufeed.server._server.ModelServer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import cast

import numpy as np
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpufeed import __version__
from gpufeed.models import ClassifierHead, DenseHead
from gpufeed.server._access import AccessGuard, route_of
from gpufeed.server._accounting import Accounting, count_refusal
from gpufeed.server._dataplane import DataPlane, Inference
from gpufeed.server._dense import check_json_map_pixels, dense_json, dense_png, map_pixels, map_size_of, wants_png
from gpufeed.server._errors import RequestError, json_bytes, shown
from gpufeed.server._http import JSONAnswer, compress_response, content_type_of, read_body, response_coding
from gpufeed.server._kserve_response import encode_response
from gpufeed.server._offload import INLINE_PARSE_BYTES, ParsePool
from gpufeed.server._openapi import openapi_document
from gpufeed.server._requests import body_limit, kserve_items, rest_items, rest_video, top_k_of
from gpufeed.server._state import ServingState
from gpufeed.server._trim import TRIM_AFTER_BYTES, release_free_memory
from gpufeed.server._video import (
    VideoUpload,
    hop_of,
    is_video_type,
    kserve_video,
    open_video,
    video_document,
    video_outputs,
    wants_windows,
)

__all__ = ["build_app"]

# Responses larger than this are compressed on a parser thread rather than on the event loop.
_INLINE_COMPRESS_BYTES = 64 * 1024


def plane_of(request: Request) -> DataPlane:
    """The data plane of the app that received ``request`` (set by :func:`build_app`)."""
    return request.app.state.plane


def _version(request: Request) -> str:
    return request.path_params.get("version", "1")


async def _answer(request: Request, payload: bytes, headers: dict[str, str]) -> Response:
    """A 200 answer, compressed when the client asked for it (Accept-Encoding)."""
    coding = response_coding(request.headers.get("accept-encoding"))
    if coding is not None and len(payload) > _INLINE_COMPRESS_BYTES:
        payload, extra = await plane_of(request).pool.run(compress_response, payload, coding)
    else:
        payload, extra = compress_response(payload, coding)
    return Response(payload, 200, headers={**headers, **extra})


async def _body(request: Request, call: Inference) -> bytes:
    limit, setting = body_limit(call.model, call.plane.cfg)
    return await read_body(request, limit, call.seconds_left(), setting)


# -- inference ------------------------------------------------------------------------------------


async def infer(request: Request) -> Response:
    """``POST /v2/models/{name}[/versions/1]/infer``: KServe v2, JSON or binary tensors."""
    async with plane_of(request).inference(request.path_params["name"], _version(request)) as call:
        body = await _body(request, call)
        headers = request.headers
        coding, header_length = headers.get("content-encoding"), headers.get("inference-header-content-length")
        parsed, items = await call.prepare(
            kserve_items(call.plane.pool, call.model, call.plane.cfg, body, coding, header_length)
        )
        outputs: Mapping[str, np.ndarray]
        if isinstance(items, VideoUpload):  # a clip model's encoded video (server/_video.py)
            outputs = await kserve_video(call, parsed, items)
        else:
            outputs = await call.infer(items, parsed.outputs)
        payload, response_headers = encode_response(call.model.name, parsed, outputs, call.model.card.labels)
        return await _answer(request, payload, response_headers)


async def predict(request: Request) -> Response:
    """``POST /v1/models/{name}/predict``: images -> top-k labels and scores (or a dense model's maps)."""
    async with plane_of(request).inference(request.path_params["name"]) as call:
        head = call.model.head
        if isinstance(head, DenseHead):
            return await _predict_maps(request, call)
        body = await _body(request, call)
        coding, kind = request.headers.get("content-encoding"), request.headers.get("content-type")
        if head.accepts_video and is_video_type(content_type_of(kind)[0]):
            return await _predict_video(request, call, body, coding)
        top_k = top_k_of(request.query_params.get("top_k"), call.plane.cfg.top_k, call.model.card.spec.num_classes)
        inline = coding in (None, "identity") and len(body) <= INLINE_PARSE_BYTES
        items = await call.validate(rest_items, body, coding, kind, inline=inline)
        outputs = await call.infer(items)
        document = cast(ClassifierHead, head).rest_answer(
            call.model.name, outputs["scores"], top_k, call.model.card.labels
        )
        return await _answer(request, json_bytes(document), {"content-type": "application/json"})


async def _predict_video(request: Request, call: Inference, body: bytes, coding: str | None) -> Response:
    """A clip model's REST video answer: per-frame scores (and per-window ones with ``?windows=true``)."""
    query, cfg = request.query_params, call.plane.cfg
    hop = hop_of(query.get("hop_frames"), cfg.video_hop_frames, "query parameter hop_frames")
    keep = wants_windows(None, query.get("windows"))
    upload = await call.validate(rest_video, body, coding)
    job = await call.validate(open_video, upload, hop, keep)
    tensors = await video_outputs(call, job)
    document = video_document(call.model.name, call.model.card, job, tensors)
    return await _answer(request, json_bytes(document), {"content-type": "application/json"})


async def _predict_maps(request: Request, call: Inference) -> Response:
    """A dense model's REST answer: one PNG map (``Accept: image/png``) or JSON maps (server/_dense.py)."""
    where = map_size_of(request.query_params.get("size"))
    png = wants_png(request.headers.get("accept"))
    body = await _body(request, call)
    coding, kind = request.headers.get("content-encoding"), request.headers.get("content-type")
    items = await call.validate(rest_items, body, coding, kind, png)
    spec, sizes, pool = call.model.card.spec, [item.size for item in items], call.plane.pool
    if not png:  # refused before inference: the answer's size is known from the headers
        check_json_map_pixels(spec, sizes, where, call.plane.cfg.max_json_map_pixels)
    logits = (await call.infer(items)).logits
    if png:
        payload = await pool.run(dense_png, logits[0], spec, sizes[0], where)
        headers = {"content-type": "image/png"}
    else:
        payload = await pool.run(dense_json, call.model.name, logits, spec, sizes, where)
        headers = {"content-type": "application/json"}
    response = await _answer(request, payload, headers)
    if len(payload) >= TRIM_AFTER_BYTES or map_pixels(spec, sizes, "input") >= TRIM_AFTER_BYTES:
        # Once the answer is sent, the pages its arrays used go back to the system (server/_trim.py).
        response.background = BackgroundTask(pool.run, release_free_memory)
    return response


# -- health, metadata, Triton's extensions --------------------------------------------------------


async def live(request: Request) -> Response:
    return JSONAnswer({"live": True})


async def ready(request: Request) -> Response:
    plane = plane_of(request)
    ok = plane.ready
    body: dict[str, object] = {"ready": ok}
    if plane.state.load_error is not None:
        body["error"] = f"loading failed: {plane.state.load_error}"
    return JSONAnswer(body, status_code=200 if ok else 400)


async def server_metadata(request: Request) -> Response:
    return JSONAnswer(plane_of(request).server_metadata())


async def model_metadata(request: Request) -> Response:
    return JSONAnswer(plane_of(request).model_metadata(request.path_params["name"], _version(request)))


async def model_ready(request: Request) -> Response:
    name = request.path_params["name"]
    ok = plane_of(request).model_ready(name, _version(request))
    return JSONAnswer({"name": name, "ready": ok}, status_code=200 if ok else 400)


async def config(request: Request) -> Response:
    return JSONAnswer(plane_of(request).model_config(request.path_params["name"], _version(request)))


async def stats(request: Request) -> Response:
    return JSONAnswer(plane_of(request).statistics(request.path_params.get("name"), _version(request)))


async def repository(request: Request) -> Response:
    plane = plane_of(request)
    body = await read_body(request, 4096, plane.cfg.request_timeout_seconds)
    try:
        doc = json.loads(body) if body.strip() else {}
    except (ValueError, RecursionError):
        raise RequestError("malformed_request", "the repository index request must be a JSON object") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
        raise RequestError("malformed_request", 'the repository index request is {"ready": true|false} or {}')
    return JSONAnswer(plane.repository_index(doc.get("ready", False)))


async def repository_control(request: Request) -> Response:
    raise RequestError(
        "malformed_request",
        "models are loaded when gpufeed serve starts (its --model-repo or --model); loading and unloading "
        f"through the API is not supported. Served: {', '.join(plane_of(request).state.entries)}",
    )


async def list_models(request: Request) -> Response:
    state = plane_of(request).state
    return JSONAnswer({"models": [{"name": n, "ready": state.warmed_up(n)} for n in state.entries]})


async def metrics_endpoint(request: Request) -> Response:
    payload, content_type = plane_of(request).metrics.exposition()
    return Response(payload, headers={"content-type": content_type})


async def openapi(request: Request) -> Response:
    names = list(plane_of(request).state.entries)
    return JSONAnswer(openapi_document(names, __version__, auth=request.app.state.token_required))


# -- refusals -------------------------------------------------------------------------------------


async def refused(request: Request, exc: Exception) -> Response:
    """Every RequestError a route raises: counted by reason (a model still loading is not), then JSON."""
    err = cast(RequestError, exc)  # registered for RequestError only (Starlette types handlers for Exception)
    name = request.path_params.get("name") or route_of(request.url.path)[0]
    count_refusal(plane_of(request).metrics, name, err)
    return JSONAnswer(err.to_json(), status_code=err.status, headers=err.headers)


async def no_route(request: Request, exc: Exception) -> Response:
    """404 (no such path) and 405 (wrong method): JSON naming the problem, counted like any refusal."""
    plane = plane_of(request)
    status = getattr(exc, "status_code", 404)
    path = request.url.path
    name, _ = route_of(path)
    shown_request = f"{shown(request.method, 12)[1:-1]} {shown(path, 200)}"
    headers = dict(getattr(exc, "headers", None) or {})
    if status == 405:
        reason = "malformed_request"
        allowed = headers.get("Allow", headers.get("allow", "?"))
        message = f"{shown_request}: method not allowed; allowed: {allowed}"
    elif path.startswith(("/v1/models/", "/v2/models/")):
        reason = "unknown_model"
        message = f"{shown_request}: no such model or endpoint; models: {', '.join(plane.state.entries)}"
    else:
        reason, message = "malformed_request", f"{shown_request}: no such endpoint (see GET /openapi.json)"
    plane.metrics.count_error(name, reason)
    return JSONAnswer({"error": message, "reason": reason}, status, headers=headers)


# -- the app --------------------------------------------------------------------------------------


def _routes() -> list[Route]:
    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", stats),  # before /v2/models/{name}, as in Triton
        Route("/v2/repository/index", repository, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", repository_control, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", repository_control, methods=["POST"]),
        Route("/v1/models", list_models),
        Route("/v1/models/{name}/predict", predict, methods=["POST"]),
        Route("/metrics", metrics_endpoint),
        Route("/openapi.json", openapi),
    ]
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [
            Route(base, model_metadata),
            Route(base + "/ready", model_ready),
            Route(base + "/config", config),
            Route(base + "/stats", stats),
            Route(base + "/infer", infer, methods=["POST"]),
        ]
    return routes


def build_app(state: ServingState, token: str | None = None, plane: DataPlane | None = None) -> Starlette:
    """The HTTP front: the ASGI app over a data plane (loading, gRPC and the stop are :mod:`._server`'s).

    Args:
        state: The models and their life cycle.
        token: Bearer token every route but the health probes requires; ``None``: open access.
        plane: The data plane to answer from (shared with the gRPC front); ``None``: one of its own
            over a new :class:`~gpufeed.server._offload.ParsePool` (``app.state.parse_pool``, the
            caller's to close).
    """
    plane = plane or DataPlane(state, ParsePool())
    app = Starlette(
        routes=_routes(),
        exception_handlers={RequestError: refused, 404: no_route, 405: no_route},
        middleware=[Middleware(Accounting, metrics=state.metrics), Middleware(AccessGuard, state=state, token=token)],
    )
    # No 307 from "/v2/models/x/" to "/v2/models/x": a path that does not exist is a 404 naming it.
    app.router.redirect_slashes = False
    app.state.plane, app.state.parse_pool, app.state.token_required = plane, plane.pool, token is not None
    return app
