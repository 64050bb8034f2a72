"""KServe v2 over gRPC: ``inference.GRPCInferenceService`` beside the HTTP app, in the same process and event loop.

The service is the one Triton and KServe speak (their protos are wire-compatible); the message and
stub modules are the generated ones that ship in ``tritonclient[grpc]`` (``service_pb2``,
``service_pb2_grpc``, ``model_config_pb2``), installed by the ``grpc`` extra. grpcio's asyncio server
(``grpc.aio``) is started and stopped by the HTTP app's lifespan, on uvicorn's event loop, so both
front ends share the model batchers, the parser threads, the limits, the token, the metrics and
the drain. Implemented: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
ModelInfer, and Triton's ModelConfig, ModelStatistics and RepositoryIndex; any other method
answers UNIMPLEMENTED.

==================================================  ==========================  =================
refusal (the HTTP side's reason)                    gRPC status                 HTTP equivalent
==================================================  ==========================  =================
bad tensor, image, shape, datatype, base64          INVALID_ARGUMENT            400 / 415
unknown model or version                            NOT_FOUND                   404
missing or wrong bearer token                       UNAUTHENTICATED             401
queue full (trailing metadata ``retry-after``)      UNAVAILABLE                 503
model loading, or the server draining               UNAVAILABLE                 503
no answer within serve.request_timeout_seconds      DEADLINE_EXCEEDED           504
message over serve.max_body_bytes                   RESOURCE_EXHAUSTED (grpc)   413
a bug in the server                                 INTERNAL                    500
==================================================  ==========================  =================

Messages are the HTTP side's, word for word. ServerLive and ServerReady need no token (probes);
every other method needs gRPC metadata ``authorization: Bearer <token>`` when a token is set. Every
ModelInfer answer is counted in ``gpufeed_server_requests_total{protocol="grpc"}`` with the HTTP
status of the equivalent answer as ``code`` (so dashboards' 4xx/5xx panels need no second
vocabulary), and timed in ``gpufeed_server_request_seconds{protocol="grpc"}``.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from gpufeed import __version__
from gpufeed.server._access import AccessGuard
from gpufeed.server._dense import output_metadata, output_tensors
from gpufeed.server._errors import REASONS, RequestError, shown
from gpufeed.server._grpc_tensors import infer_request, infer_response
from gpufeed.server._inputs import items_from_kserve, kserve_inputs
from gpufeed.server._requests import max_elements
from gpufeed.server._submit import model_config_of, submit_and_wait
from gpufeed.server._triton import EXTENSIONS, repository_index

__all__ = ["EXTRA_HINT", "GrpcFront", "require_grpc"]

log = logging.getLogger("gpufeed.server")

EXTRA_HINT = "pip install 'gpufeed[grpc]' (grpcio and tritonclient[grpc])"
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})


def require_grpc():
    """``(grpc, service_pb2, service_pb2_grpc, model_config_pb2)``; ImportError naming the extra if missing."""
    try:
        import grpc
        from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
    except ImportError as err:
        raise ImportError(f"serving gRPC needs the grpc extra ({err.name or err} is missing): {EXTRA_HINT}") from None
    return grpc, service_pb2, service_pb2_grpc, model_config_pb2


def _status_codes(grpc) -> dict[int, object]:
    """HTTP status of a refusal -> gRPC status code."""
    code = grpc.StatusCode
    return {
        400: code.INVALID_ARGUMENT,
        401: code.UNAUTHENTICATED,
        404: code.NOT_FOUND,
        413: code.RESOURCE_EXHAUSTED,
        415: code.INVALID_ARGUMENT,
        499: code.CANCELLED,
        503: code.UNAVAILABLE,
        504: code.DEADLINE_EXCEEDED,
    }


class GrpcFront:
    """The gRPC server: built, bound and started by :meth:`start` on the running event loop.

    Args:
        state: The :class:`~gpufeed.server._state.ServingState` the HTTP app serves.
        pool: The HTTP app's :class:`~gpufeed.server._offload.ParsePool` (request validation runs there).
        token: The bearer token, or ``None`` for open access.
        host, port: Where to listen (port 0: a free one; :attr:`port` is the bound one after start).
        announce: Called with one line once the port is bound.
    """

    def __init__(self, state, pool, token: str | None, host: str, port: int, announce=None) -> None:
        self.state, self.pool, self.host, self.requested_port = state, pool, host, port
        self.guard = AccessGuard(None, state, token)
        self.announce = announce
        self.port: int | None = None
        self.server = None
        self.grpc, self.pb2, self.pb2_grpc, self.config_pb2 = require_grpc()
        self.codes = _status_codes(self.grpc)

    async def start(self) -> None:
        """Bind and start serving; raises RuntimeError naming the address if it cannot bind."""
        grpc, cfg = self.grpc, self.state.cfg
        limit = cfg.max_body_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", max(limit, 64 * 1024 * 1024)),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not a second listener
            ]
        )
        self.pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Service(self), self.server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            self.port = self.server.add_insecure_port(f"{host}:{self.requested_port}")
        except RuntimeError as err:
            raise RuntimeError(f"cannot listen for gRPC on {host}:{self.requested_port}: {err}") from None
        if not self.port:  # older grpcio returns 0 instead of raising
            raise RuntimeError(f"cannot listen for gRPC on {host}:{self.requested_port}")
        await self.server.start()
        if self.announce is not None:
            self.announce(f"gpufeed serve: KServe v2 over gRPC on {host}:{self.port}")

    async def stop(self, grace: float = 1.0) -> None:
        if self.server is not None:
            await self.server.stop(grace)


class _Abort(Exception):
    """A refusal to send as a gRPC status (raised inside a method, sent outside its try)."""

    def __init__(self, code, message: str, status: int, trailers=()) -> None:
        super().__init__(message)
        self.code, self.message, self.status, self.trailers = code, message, status, tuple(trailers)


def _service_base():
    _, _, pb2_grpc, _ = require_grpc()
    return pb2_grpc.GRPCInferenceServiceServicer


class _Service(_service_base()):  # type: ignore[misc]
    """The servicer: each method checks the token, then answers from the shared serving state."""

    def __init__(self, front: GrpcFront) -> None:
        self.front, self.state, self.pb2 = front, front.state, front.pb2

    # -- plumbing ---------------------------------------------------------------------------------

    def _refusal(self, err: RequestError, model: str) -> _Abort:
        if err.reason in REASONS:  # as the HTTP side counts (a model still loading is not a refusal)
            self.state.metrics.count_error(model, err.reason)
        trailers = [("retry-after", v) for k, v in err.headers.items() if k.lower() == "retry-after"]
        code = self.front.codes.get(err.status, self.front.grpc.StatusCode.INTERNAL)
        return _Abort(code, err.message, err.status, trailers)

    def _check_token(self, context, method: str, model: str = "") -> None:
        if method in OPEN_METHODS or not self.front.guard.enabled:
            return
        headers = [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in context.invocation_metadata()]
        problem = self.front.guard.problem(headers)
        if problem is not None:
            self.state.metrics.count_error(model, "unauthorized")
            message = problem[0].replace("'Authorization: Bearer <token>'", "metadata 'authorization: Bearer <token>'")
            raise _Abort(self.front.grpc.StatusCode.UNAUTHENTICATED, message.replace("header", "metadata"), 401)

    async def _answer(self, context, method: str, model: str, handler, status: list | None = None):
        """Run ``handler()``; turn refusals into their status and anything unexpected into INTERNAL.

        ``status[0]``, when given, gets the HTTP equivalent of the answer (for the request metrics).
        """
        try:
            self._check_token(context, method, model)
            response = await handler()
            if status is not None:
                status[0] = 200
            return response
        except _Abort as err:
            abort = err
        except RequestError as err:
            abort = self._refusal(err, model)
        except Exception as err:
            log.exception("internal error handling gRPC %s", method)
            self.state.metrics.count_error(model, "internal")
            abort = _Abort(self.front.grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}", 500)
        if status is not None:
            status[0] = abort.status
        if abort.trailers:
            context.set_trailing_metadata(abort.trailers)
        await context.abort(abort.code, abort.message)

    def _lookup(self, name: str, version: str) -> str:
        if name not in self.state.entries:
            raise RequestError("unknown_model", f"model {shown(name, 100)} is not served here")
        if version not in ("", "1"):
            raise RequestError("unknown_model", f"model {name!r} has only version 1")
        return name

    # -- health and metadata ----------------------------------------------------------------------

    async def ServerLive(self, request, context):
        return await self._answer(context, "ServerLive", "", self._live)

    async def _live(self):
        return self.pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        async def ready():
            return self.pb2.ServerReadyResponse(ready=self.state.ready)

        return await self._answer(context, "ServerReady", "", ready)

    async def ModelReady(self, request, context):
        async def ready():
            name = self._lookup(request.name, request.version)
            model = self.state.models.get(name)
            ok = model is not None and model.ready and not self.state.closing
            return self.pb2.ModelReadyResponse(ready=ok)

        return await self._answer(context, "ModelReady", request.name, ready)

    async def ServerMetadata(self, request, context):
        async def metadata():
            return self.pb2.ServerMetadataResponse(name="gpufeed", version=__version__, extensions=list(EXTENSIONS))

        return await self._answer(context, "ServerMetadata", "", metadata)

    async def ModelMetadata(self, request, context):
        async def metadata():
            name = self._lookup(request.name, request.version)
            card = self.state.entries[name].card
            tensor = self.pb2.ModelMetadataResponse.TensorMetadata
            inputs = [tensor(**i) for i in kserve_inputs(card)]
            outputs = [tensor(name=n, datatype="FP32", shape=shape) for n, shape in output_metadata(card.spec)]
            return self.pb2.ModelMetadataResponse(
                name=name, versions=["1"], platform="onnxruntime_onnx", inputs=inputs, outputs=outputs
            )

        return await self._answer(context, "ModelMetadata", request.name, metadata)

    async def ModelConfig(self, request, context):
        async def config():
            from google.protobuf import json_format

            document = model_config_of(self.state, self._lookup(request.name, request.version))
            message = json_format.ParseDict(document, self.front.config_pb2.ModelConfig())
            return self.pb2.ModelConfigResponse(config=message)

        return await self._answer(context, "ModelConfig", request.name, config)

    async def ModelStatistics(self, request, context):
        async def statistics():
            from google.protobuf import json_format

            names = [self._lookup(request.name, request.version)] if request.name else list(self.state.entries)
            document = self.state.metrics.stats.response(names)
            return json_format.ParseDict(document, self.pb2.ModelStatisticsResponse())

        return await self._answer(context, "ModelStatistics", request.name, statistics)

    async def RepositoryIndex(self, request, context):
        async def index():
            s = self.state
            models = repository_index(s.entries, s.models, s.load_error, s.closing, request.ready)
            entry = self.pb2.RepositoryIndexResponse.ModelIndex
            return self.pb2.RepositoryIndexResponse(models=[entry(**m) for m in models])

        return await self._answer(context, "RepositoryIndex", "", index)

    # -- inference --------------------------------------------------------------------------------

    async def ModelInfer(self, request, context):
        started = time.perf_counter()
        state, metrics, name = self.state, self.state.metrics, request.model_name
        metrics.inflight.inc()
        state.inflight += 1  # the drain waits for gRPC requests as for HTTP ones
        status = [499]  # stays so when the client cancels (or its deadline passes) mid-request
        try:
            return await self._answer(context, "ModelInfer", name, lambda: self._infer(request, started), status)
        finally:
            metrics.inflight.dec()
            state.inflight -= 1
            metrics.observe_request(name, "grpc", status[0], time.perf_counter() - started)

    async def _infer(self, request, started: float):
        state, cfg = self.state, self.state.cfg
        model = state.model(request.model_name)
        if request.model_version not in ("", "1"):
            raise RequestError("unknown_model", f"model {model.name!r} has only version 1")
        t0 = time.perf_counter()
        parsed, items = await self.front.pool.run(_validated, model, cfg, request)
        state.metrics.observe_stage(model.name, "preprocess", time.perf_counter() - t0)
        logits = np.stack(await submit_and_wait(cfg, model, items, started))
        t0 = time.perf_counter()
        tensors = output_tensors(logits, model.card.spec, parsed.outputs)
        response = infer_response(self.pb2, model.name, parsed, tensors, model.card.labels)
        state.metrics.observe_answer(model.name, items, time.perf_counter() - t0)
        return response


def _validated(model, cfg, message):
    """``(request, items)`` of a ModelInferRequest: the HTTP side's checks, on a parser thread."""
    parsed = infer_request(message, max_elements(model, cfg))
    return parsed, items_from_kserve(model, parsed, cfg.max_image_pixels, cfg.max_images_per_request)
