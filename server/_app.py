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
                                               files -> top-k labels and scores as JSON
GET  /metrics                                  Prometheus text format
GET  /openapi.json                             this API as OpenAPI 3.0 (for clients and the fuzzing tests)
=============================================  ====================================================

Health answers follow the KServe v2 protocol: 200 for true, a 4xx (400, as Triton) for false.
Bodies are read with the limits of :mod:`._http` and turned into batch items by :mod:`._requests`
on :class:`._offload.ParsePool` threads, never on the event loop. Every refusal is a JSON ``{"error", "reason"}`` counted by
reason (one handler for :class:`RequestError` on every route; 404/405 included); every answer to
an inference path is counted and timed by :class:`._accounting.Accounting`, which also turns
anything unexpected into a JSON 500. With a bearer token configured, every route but the two
health probes needs it (:mod:`._access`). With ``grpc_port`` the lifespan also runs KServe v2 over
gRPC (:mod:`._grpc`) on the same event loop, sharing all of the above.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpufeed import __version__
from gpufeed.server._access import AccessGuard, route_of
from gpufeed.server._accounting import Accounting
from gpufeed.server._dense import dense_document, dense_png, map_size_of, output_metadata, output_tensors, wants_png
from gpufeed.server._errors import REASONS, RequestError, json_bytes, shown
from gpufeed.server._http import JSONAnswer, compress_response, read_body, response_coding
from gpufeed.server._inputs import items_from_kserve, kserve_inputs
from gpufeed.server._kserve import encode_response, parse_request
from gpufeed.server._model import scores_from_logits
from gpufeed.server._offload import ParsePool
from gpufeed.server._openapi import openapi_document
from gpufeed.server._requests import kserve_items, max_elements, rest_items, top_k_of
from gpufeed.server._state import ServingState
from gpufeed.server._submit import model_config_of, seconds_left, submit_and_wait
from gpufeed.server._triton import EXTENSIONS, repository_index

__all__ = ["build_app"]

# Responses larger than this are compressed on a parser thread rather than on the event loop.
_INLINE_COMPRESS_BYTES = 64 * 1024


def build_app(
    state: ServingState,
    on_shutdown=None,
    token: str | None = None,
    *,
    grpc_port: int | None = None,
    grpc_host: str = "127.0.0.1",
    announce=None,
) -> Starlette:
    """The ASGI app over ``state``; model loading starts when the app starts (lifespan).

    Args:
        state: The models and their life cycle.
        on_shutdown: Called after the models are drained and released.
        token: Bearer token every route but the health probes requires; ``None``: open access.
        grpc_port: Also serve KServe v2 over gRPC on this port (0: a free one; ``None``: no gRPC),
            started and stopped with the app on its event loop (:mod:`._grpc`); the bound port is
            ``app.state.grpc.port`` once the app has started.
        grpc_host: Address the gRPC server binds.
        announce: Called with a line naming the gRPC address once it is bound.
    """
    cfg, metrics = state.cfg, state.metrics
    pool = ParsePool()

    async def answer(request: Request, payload: bytes, headers: dict[str, str]) -> Response:
        """A 200 answer, compressed when the client asked for it (Accept-Encoding)."""
        coding = response_coding(request.headers.get("accept-encoding"))
        if coding is not None and len(payload) > _INLINE_COMPRESS_BYTES:
            payload, extra = await pool.run(compress_response, payload, coding)
        else:
            payload, extra = compress_response(payload, coding)
        return Response(payload, 200, headers={**headers, **extra})

    async def inference(request: Request, handler) -> Response:
        """Track the request as in flight (the drain waits for these) while ``handler`` answers it."""
        metrics.inflight.inc()
        state.inflight += 1
        try:
            return await handler(request, state.model(request.path_params["name"]), time.perf_counter())
        finally:
            metrics.inflight.dec()
            state.inflight -= 1

    async def kserve_infer(request: Request, model, started: float) -> Response:
        if request.path_params.get("version", "1") != "1":
            raise RequestError("unknown_model", f"model {model.name!r} has only version 1")
        body = await read_body(request, cfg.max_body_bytes, seconds_left(cfg, started))
        t0 = time.perf_counter()
        header_length = request.headers.get("inference-header-content-length")
        encoding = request.headers.get("content-encoding")
        parsed, items = await pool.run(kserve_items, model, cfg, body, encoding, header_length)
        if parsed is None:  # megabytes of JSON: parsed in the worker process, the event loop stays free
            inflated = items
            parsed = await pool.run_isolated(parse_request, inflated, header_length, max_elements(model, cfg))
            items = await pool.run(items_from_kserve, model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)
        metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(cfg, model, items, started))
        t0 = time.perf_counter()
        tensors = output_tensors(logits, model.card.spec, parsed.outputs)
        payload, response_headers = encode_response(model.name, parsed, tensors, model.card.labels)
        response = await answer(request, payload, response_headers)
        metrics.observe_answer(model.name, items, time.perf_counter() - t0)
        return response

    async def rest_predict(request: Request, model, started: float) -> Response:
        if model.card.spec.is_dense:
            return await rest_predict_maps(request, model, started)
        body = await read_body(request, cfg.max_body_bytes, seconds_left(cfg, started))
        t0 = time.perf_counter()
        top_k = top_k_of(request.query_params.get("top_k"), cfg.top_k, model.card.spec.num_classes)
        items = await pool.run(
            rest_items, model, cfg, body, request.headers.get("content-encoding"), request.headers.get("content-type")
        )
        metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(cfg, model, items, started))
        t0 = time.perf_counter()
        scores = scores_from_logits(logits, model.card.spec.multilabel)
        labels = model.card.labels
        predictions = []
        for i, row in enumerate(scores):
            top = np.argsort(-row, kind="stable")[:top_k]
            predictions.append(
                {"image": i, "top_k": [{"label": labels[j], "index": int(j), "score": float(row[j])} for j in top]}
            )
        document = {"model": model.name, "multilabel": model.card.spec.multilabel, "predictions": predictions}
        response = await answer(request, json_bytes(document), {"content-type": "application/json"})
        metrics.observe_answer(model.name, items, time.perf_counter() - t0)
        return response

    async def rest_predict_maps(request: Request, model, started: float) -> Response:
        """A dense model's REST answer: one PNG map (``Accept: image/png``) or JSON maps (server/_dense.py)."""
        where = map_size_of(request.query_params.get("size"))
        png = wants_png(request.headers.get("accept"))
        body = await read_body(request, cfg.max_body_bytes, seconds_left(cfg, started))
        t0 = time.perf_counter()
        items = await pool.run(
            rest_items, model, cfg, body, request.headers.get("content-encoding"), request.headers.get("content-type")
        )
        if png and len(items) != 1:
            raise RequestError(
                "malformed_request",
                f"an image/png answer holds one map: send one image, not {len(items)}, or accept application/json",
            )
        metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(cfg, model, items, started))
        t0 = time.perf_counter()
        spec, sizes = model.card.spec, [item.size for item in items]
        if png:
            payload = await pool.run(dense_png, logits[0], spec, sizes[0], where)
            headers = {"content-type": "image/png"}
        else:
            payload = json_bytes(await pool.run(dense_document, model.name, logits, spec, sizes, where))
            headers = {"content-type": "application/json"}
        response = await answer(request, payload, headers)
        metrics.observe_answer(model.name, items, time.perf_counter() - t0)
        return response

    async def infer(request: Request) -> Response:
        return await inference(request, kserve_infer)

    async def predict(request: Request) -> Response:
        return await inference(request, rest_predict)

    def lookup(request: Request) -> str:
        """The served model named in the path (version 1 only)."""
        name = request.path_params["name"]
        if name not in state.entries:
            raise RequestError("unknown_model", f"model {shown(name, 100)} is not served here")
        if request.path_params.get("version", "1") != "1":
            raise RequestError("unknown_model", f"model {name!r} has only version 1")
        return name

    async def live(request: Request) -> Response:
        return JSONAnswer({"live": True})

    async def ready(request: Request) -> Response:
        ok = state.ready
        body = {"ready": ok}
        if state.load_error is not None:
            body["error"] = f"loading failed: {state.load_error}"
        return JSONAnswer(body, status_code=200 if ok else 400)

    async def server_metadata(request: Request) -> Response:
        return JSONAnswer({"name": "gpufeed", "version": __version__, "extensions": list(EXTENSIONS)})

    async def model_metadata(request: Request) -> Response:
        name = lookup(request)
        card = state.entries[name].card
        inputs = kserve_inputs(card)
        outputs = [{"name": n, "datatype": "FP32", "shape": shape} for n, shape in output_metadata(card.spec)]
        facts = {
            "task": card.spec.task,
            "architecture": card.spec.name,
            "batch_size": card.batch_size,
            "precision": card.precision,
            "size_px": card.spec.to_dict()["size_px"],
            "width_px": card.spec.size.width_px,
            "height_px": card.spec.size.height_px,
            "eval_crop_fraction": card.spec.eval_crop_fraction,
            "clip_length_frames": card.spec.clip_length_frames,
            "layout": card.spec.input_layout,
            "multilabel": card.spec.multilabel,
            "labels": list(card.labels),
            # A request sends exactly one of the inputs (the encoded image or the decoded pixels).
            "inputs_per_request": 1,
        }
        return JSONAnswer(
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
        name = lookup(request)
        model = state.models.get(name)
        ok = model is not None and model.ready and not state.closing
        return JSONAnswer({"name": name, "ready": ok}, status_code=200 if ok else 400)

    async def config(request: Request) -> Response:
        return JSONAnswer(model_config_of(state, lookup(request)))

    async def stats(request: Request) -> Response:
        names = [lookup(request)] if "name" in request.path_params else list(state.entries)
        return JSONAnswer(metrics.stats.response(names))

    async def repository(request: Request) -> Response:
        body = await read_body(request, 4096, cfg.request_timeout_seconds)
        try:
            doc = json.loads(body) if body.strip() else {}
        except (ValueError, RecursionError):
            raise RequestError("malformed_request", "the repository index request must be a JSON object") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
            raise RequestError("malformed_request", 'the repository index request is {"ready": true|false} or {}')
        index = repository_index(state.entries, state.models, state.load_error, state.closing, doc.get("ready", False))
        return JSONAnswer(index)

    async def repository_control(request: Request) -> Response:
        raise RequestError(
            "malformed_request",
            "models are loaded when gpufeed serve starts (its --model-repo or --model); loading and unloading "
            f"through the API is not supported. Served: {', '.join(state.entries)}",
        )

    async def list_models(request: Request) -> Response:
        listing = [{"name": n, "ready": bool(state.models.get(n) and state.models[n].ready)} for n in state.entries]
        return JSONAnswer({"models": listing})

    async def metrics_endpoint(request: Request) -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, headers={"content-type": content_type})

    async def openapi(request: Request) -> Response:
        return JSONAnswer(openapi_document(list(state.entries), __version__, auth=token is not None))

    async def refused(request: Request, err: RequestError) -> Response:
        """Every RequestError a route raises: counted by reason (a model still loading is not), then JSON."""
        if err.reason in REASONS:
            name = request.path_params.get("name") or route_of(request.url.path)[0]
            metrics.count_error(name, err.reason)
        return JSONAnswer(err.to_json(), status_code=err.status, headers=err.headers)

    async def no_route(request: Request, exc) -> Response:
        """404 (no such path) and 405 (wrong method): JSON naming the problem, counted like any refusal."""
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
            message = f"{shown_request}: no such model or endpoint; models: {', '.join(state.entries)}"
        else:
            reason, message = "malformed_request", f"{shown_request}: no such endpoint (see GET /openapi.json)"
        metrics.count_error(name, reason)
        return JSONAnswer({"error": message, "reason": reason}, status, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        front = None
        if grpc_port is not None:
            # Deferred: gpufeed.server._grpc imports the optional grpc extra (grpcio, tritonclient[grpc]).
            from gpufeed.server._grpc import GrpcFront

            front = GrpcFront(state, pool, token, grpc_host, grpc_port, announce)
            try:
                await front.start()
            except Exception as err:  # kept for start_server's error; uvicorn then reports a failed startup
                app.state.grpc_error = err
                raise
            app.state.grpc = front
        state.start_loading()
        yield
        # Graceful shutdown: no new requests, queued ones finish, then the models go. The drain
        # has already waited for gRPC requests in flight (they count in state.inflight).
        if front is not None:
            await front.stop(grace=1.0)
        await asyncio.get_running_loop().run_in_executor(None, state.close)
        pool.close()
        if on_shutdown is not None:
            on_shutdown()

    model_path, version_path = "/v2/models/{name}", "/v2/models/{name}/versions/{version}"
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
    for base in (model_path, version_path):
        routes += [
            Route(base, model_metadata),
            Route(base + "/ready", model_ready),
            Route(base + "/config", config),
            Route(base + "/stats", stats),
            Route(base + "/infer", infer, methods=["POST"]),
        ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={RequestError: refused, 404: no_route, 405: no_route},
        middleware=[Middleware(Accounting, metrics=metrics), Middleware(AccessGuard, state=state, token=token)],
    )
    # No 307 from "/v2/models/x/" to "/v2/models/x": a path that does not exist is a 404 naming it.
    app.router.redirect_slashes = False
    app.state.parse_pool = pool
    app.state.grpc, app.state.grpc_error = None, None
    return app
