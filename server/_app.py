"""The ASGI app (Starlette, run by uvicorn): KServe v2, simple REST, health and /metrics.

=====================================  ========================================================
route                                  answers
=====================================  ========================================================
GET  /v2/health/live                   200 while the process serves HTTP
GET  /v2/health/ready                  200 once every model is loaded and warmed up, else 503
GET  /v2                               server metadata (extensions: binary_tensor_data, classification)
GET  /v2/models/{name}                 model metadata: inputs, outputs, card facts
GET  /v2/models/{name}/ready           200 ready, 503 loading, 404 unknown
POST /v2/models/{name}[/versions/1]/infer  KServe v2 inference (JSON or binary tensors)
GET  /v1/models                        the served models
POST /v1/models/{name}/predict         an image body (image/jpeg, image/png) or multipart/form-data
                                       files -> top-k labels and scores as JSON
GET  /metrics                          Prometheus text format
GET  /openapi.json                     this API as OpenAPI 3.0 (for clients and the fuzzing tests)
=====================================  ========================================================

Each inference request is timed as a whole (``gpufeed_server_request_seconds``) and by stage;
every refusal is a JSON ``{"error", "reason"}`` with a 4xx/5xx and a count by reason, including
requests for paths or methods that do not exist (``unknown_model`` under ``/v1/models/`` and
``/v2/models/``, ``malformed_request`` elsewhere). With a bearer token configured, every route but
the two health probes needs it (:mod:`gpufeed.server._access`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpufeed.server._access import AccessGuard, route_of
from gpufeed.server._batcher import BatcherClosedError, QueueFullError
from gpufeed.server._errors import REASONS, RequestError
from gpufeed.server._http import content_type_of, parse_multipart, read_body
from gpufeed.server._inputs import items_from_images, items_from_kserve, kserve_inputs
from gpufeed.server._kserve import encode_response, parse_request
from gpufeed.server._model import scores_from_logits
from gpufeed.server._openapi import openapi_document
from gpufeed.server._state import NotReadyError, ServingState

__all__ = ["build_app"]

log = logging.getLogger("gpufeed.server")

IMAGE_TYPES = ("image/jpeg", "image/jpg", "image/png")


def build_app(state: ServingState, on_shutdown=None, token: str | None = None) -> Starlette:
    """The ASGI app over ``state``; model loading starts when the app starts (lifespan).

    Args:
        state: The models and their life cycle.
        on_shutdown: Called after the models are drained and released.
        token: Bearer token every route but the health probes requires; ``None``: open access.
    """
    cfg, metrics = state.cfg, state.metrics

    def _left(started: float) -> float:
        return cfg.request_timeout_seconds - (time.perf_counter() - started)

    async def submit_and_wait(model, items, started: float) -> list[np.ndarray]:
        try:
            futures = model.batcher.submit(items)
        except QueueFullError as err:
            raise RequestError(
                "queue_full",
                f"model {model.name!r} is at capacity ({err.depth} of {err.capacity} images queued); retry later",
                headers={"Retry-After": str(cfg.retry_after_seconds)},
            ) from None
        except BatcherClosedError as err:
            raise NotReadyError(str(err)) from None
        remaining = cfg.request_timeout_seconds - (time.perf_counter() - started)
        waiters = [asyncio.wrap_future(f) for f in futures]
        try:
            results = await asyncio.wait_for(asyncio.gather(*waiters), max(remaining, 0.001))
        except asyncio.TimeoutError:
            model.batcher.cancel(futures)
            raise RequestError(
                "timeout", f"no answer within {cfg.request_timeout_seconds:g} s (serve.request_timeout_seconds)"
            ) from None
        except asyncio.CancelledError:  # the client went away: free the queue slots
            model.batcher.cancel(futures)
            raise
        return results

    async def guarded(request: Request, protocol: str, handler) -> Response:
        """Time the request, turn errors into JSON responses, count everything."""
        started = time.perf_counter()
        name = request.path_params.get("name", "")
        metrics.inflight.inc()
        state.inflight += 1
        try:
            response = await handler(request, state.model(name), started)
        except RequestError as err:
            if err.reason in REASONS:
                metrics.count_error(name, err.reason)
            response = JSONResponse(err.to_json(), status_code=err.status, headers=err.headers)
        except Exception as err:
            log.exception("internal error handling %s %s", request.method, request.url.path)
            metrics.count_error(name, "internal")
            response = JSONResponse({"error": f"internal error: {type(err).__name__}", "reason": "internal"}, 500)
        finally:
            metrics.inflight.dec()
            state.inflight -= 1
        metrics.observe_request(name, protocol, response.status_code, time.perf_counter() - started)
        return response

    async def kserve_infer(request: Request, model, started: float) -> Response:
        if request.path_params.get("version", "1") != "1":
            raise RequestError("unknown_model", f"model {model.name!r} has only version 1")
        body = await read_body(request, cfg.max_body_bytes, _left(started))
        t0 = time.perf_counter()
        if request.headers.get("content-encoding", "identity") != "identity":
            raise RequestError(
                "unsupported_media_type", "compressed request bodies (Content-Encoding) are not accepted"
            )
        parsed = parse_request(body, request.headers.get("inference-header-content-length"))
        items = items_from_kserve(model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)
        metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(model, items, started))
        t0 = time.perf_counter()
        tensors = {"logits": logits, "scores": scores_from_logits(logits, model.card.spec.multilabel)}
        payload, headers = encode_response(model.name, parsed, tensors, model.card.labels)
        response = Response(payload, 200, headers=headers)
        metrics.observe_stage(model.name, "postprocess", time.perf_counter() - t0)
        return response

    async def rest_predict(request: Request, model, started: float) -> Response:
        body = await read_body(request, cfg.max_body_bytes, _left(started))
        t0 = time.perf_counter()
        top_k = _top_k(request.query_params.get("top_k"), cfg.top_k, model.card.spec.num_classes)
        kind, params = content_type_of(request.headers.get("content-type"))
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
                f"Content-Type {kind or '(none)'!r} is not accepted; send image/jpeg, image/png or multipart/form-data",
            )
        items = items_from_images(model, blobs, cfg.max_image_pixels, cfg.max_images_per_request, where)
        metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(model, items, started))
        t0 = time.perf_counter()
        scores = scores_from_logits(logits, model.card.spec.multilabel)
        labels = model.card.labels
        predictions = []
        for i, row in enumerate(scores):
            top = np.argsort(-row, kind="stable")[:top_k]
            predictions.append(
                {"image": i, "top_k": [{"label": labels[j], "index": int(j), "score": float(row[j])} for j in top]}
            )
        response = JSONResponse(
            {"model": model.name, "multilabel": model.card.spec.multilabel, "predictions": predictions}
        )
        metrics.observe_stage(model.name, "postprocess", time.perf_counter() - t0)
        return response

    async def infer(request: Request) -> Response:
        return await guarded(request, "kserve", kserve_infer)

    async def predict(request: Request) -> Response:
        return await guarded(request, "rest", rest_predict)

    def lookup(request: Request):
        """The served model named in the path (version 1 only); refusals are counted like inference ones."""
        name = request.path_params["name"]
        if name not in state.entries:
            metrics.count_error(name, "unknown_model")
            raise RequestError("unknown_model", f"model {name[:100]!r} is not served here")
        if request.path_params.get("version", "1") != "1":
            metrics.count_error(name, "unknown_model")
            raise RequestError("unknown_model", f"model {name!r} has only version 1")
        return name

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        ok = state.ready
        body = {"ready": ok}
        if state.load_error is not None:
            body["error"] = f"loading failed: {state.load_error}"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def server_metadata(request: Request) -> Response:
        from gpufeed import __version__

        return JSONResponse(
            {"name": "gpufeed", "version": __version__, "extensions": ["binary_tensor_data", "classification"]}
        )

    async def model_metadata(request: Request) -> Response:
        try:
            name = lookup(request)
        except RequestError as err:
            return JSONResponse(err.to_json(), status_code=err.status)
        card = state.entries[name].card
        inputs = kserve_inputs(card)
        outputs = [{"name": n, "datatype": "FP32", "shape": [-1, card.spec.num_classes]} for n in ("logits", "scores")]
        facts = {
            "task": card.spec.task,
            "architecture": card.spec.name,
            "batch_size": card.batch_size,
            "precision": card.precision,
            "size_px": card.spec.size_px,
            "eval_crop_fraction": card.spec.eval_crop_fraction,
            "clip_length_frames": card.spec.clip_length_frames,
            "layout": card.spec.input_layout,
            "multilabel": card.spec.multilabel,
            "labels": list(card.labels),
        }
        return JSONResponse(
            {
                "name": name,
                "versions": ["1"],
                "platform": "onnxruntime_onnx",
                "inputs": inputs,
                "outputs": outputs,
                "parameters": facts,
            }
        )

    async def model_ready(request: Request) -> Response:
        try:
            name = lookup(request)
        except RequestError as err:
            return JSONResponse(err.to_json(), status_code=err.status)
        model = state.models.get(name)
        ok = model is not None and model.ready and not state.closing
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def list_models(request: Request) -> Response:
        return JSONResponse(
            {
                "models": [
                    {"name": n, "ready": bool(state.models.get(n) and state.models[n].ready)} for n in state.entries
                ]
            }
        )

    async def metrics_endpoint(request: Request) -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, headers={"content-type": content_type})

    async def openapi(request: Request) -> Response:
        from gpufeed import __version__

        return JSONResponse(openapi_document(list(state.entries), __version__, auth=token is not None))

    async def no_route(request: Request, exc) -> Response:
        """404 (no such path) and 405 (wrong method): JSON naming the problem, counted like any refusal."""
        status = getattr(exc, "status_code", 404)
        path = request.url.path
        name, _ = route_of(path)
        shown = f"{request.method[:10]} {path[:200]!r}"
        headers = dict(getattr(exc, "headers", None) or {})
        if status == 405:
            reason = "malformed_request"
            message = f"{shown}: method not allowed; allowed: {headers.get('Allow', headers.get('allow', '?'))}"
        elif path.startswith(("/v1/models/", "/v2/models/")):
            reason, message = "unknown_model", f"{shown}: no such model or endpoint; models: {', '.join(state.entries)}"
        else:
            reason, message = "malformed_request", f"{shown}: no such endpoint (see GET /openapi.json)"
        metrics.count_error(name, reason)
        return JSONResponse({"error": message, "reason": reason}, status, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.start_loading()
        yield
        # Graceful shutdown: no new requests, queued ones finish, then the models go.
        await asyncio.get_running_loop().run_in_executor(None, state.close)
        if on_shutdown is not None:
            on_shutdown()

    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/{name}", model_metadata),
        Route("/v2/models/{name}/versions/{version}", model_metadata),
        Route("/v2/models/{name}/ready", model_ready),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/v1/models", list_models),
        Route("/v1/models/{name}/predict", predict, methods=["POST"]),
        Route("/metrics", metrics_endpoint),
        Route("/openapi.json", openapi),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: no_route, 405: no_route},
        middleware=[Middleware(AccessGuard, state=state, token=token)],
    )
    # No 307 from "/v2/models/x/" to "/v2/models/x": a path that does not exist is a 404 naming it.
    app.router.redirect_slashes = False
    return app


def _top_k(raw: str | None, default: int, num_classes: int) -> int:
    if raw is None:
        return min(default, num_classes)
    try:
        value = int(raw)
    except ValueError:
        raise RequestError("malformed_request", f"query parameter top_k must be an integer, got {raw[:40]!r}") from None
    if not 1 <= value <= num_classes:
        raise RequestError("malformed_request", f"query parameter top_k must be in [1, {num_classes}], got {value}")
    return value
