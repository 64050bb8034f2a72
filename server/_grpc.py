"""KServe v2 over gRPC: ``inference.GRPCInferenceService`` beside the HTTP app, in the same process and event loop.

The service is the one Triton and KServe speak (their protos are wire-compatible); the message and
stub modules are the generated ones that ship in ``tritonclient[grpc]`` (``service_pb2``,
``service_pb2_grpc``, ``model_config_pb2``), installed by the ``grpc`` extra. grpcio's asyncio server
(``grpc.aio``) is started and stopped beside the HTTP front, as its peer, by
:class:`~gpufeed.server._server.ModelServer`, on the one event loop, so both front ends share the
model batchers, the parser threads, the limits, the token, the metrics and the drain, through the
one :class:`~gpufeed.server._dataplane.DataPlane`; the data plane makes the output tensors and this
front only encodes them as protobuf. Implemented: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
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

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from gpufeed.server._access import AccessGuard
from gpufeed.server._accounting import RequestAccount
from gpufeed.server._dataplane import DataPlane
from gpufeed.server._errors import RequestError
from gpufeed.server._grpc_tensors import infer_response
from gpufeed.server._requests import grpc_items
from gpufeed.server._video import VideoUpload, kserve_video

__all__ = ["EXTRA_HINT", "GrpcFront", "require_grpc"]

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
        plane: The server's :class:`~gpufeed.server._dataplane.DataPlane` (models, parser threads, metrics), shared with HTTP.
        token: The bearer token, or ``None`` for open access.
        host, port: Where to listen (port 0: a free one; :attr:`port` is the bound one after start).
        announce: Called with one line once the port is bound.
    """

    def __init__(
        self, plane: DataPlane, token: str | None, host: str, port: int, announce: Callable[[str], None] | None = None
    ) -> None:
        self.plane, self.state, self.host, self.requested_port = plane, plane.state, host, port
        self.guard = AccessGuard(None, plane.state, token)
        self.announce = announce
        self.port: int | None = None
        self.server: Any = None
        self.grpc, self.pb2, self.pb2_grpc, self.config_pb2 = require_grpc()
        self.codes = _status_codes(self.grpc)

    async def start(self) -> None:
        """Bind and start serving; raises RuntimeError naming the address if it cannot bind."""
        grpc, cfg = self.grpc, self.state.cfg
        limit = cfg.max_body_bytes
        if any(entry.card.spec.head.accepts_video for entry in self.state.entries.values()):
            limit = max(limit, cfg.max_video_bytes)  # a clip model's message may carry a whole video
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


class _Service(_service_base()):  # type: ignore[misc]  # a base class made at import time (the grpc extra)
    """The servicer: each method checks the token, then translates between protobuf and the data plane."""

    def __init__(self, front: GrpcFront) -> None:
        self.front, self.plane, self.pb2 = front, front.plane, front.pb2

    # -- plumbing ---------------------------------------------------------------------------------

    def _abort_of(self, err: RequestError) -> _Abort:
        trailers = [("retry-after", v) for k, v in err.headers.items() if k.lower() == "retry-after"]
        code = self.front.codes.get(err.status, self.front.grpc.StatusCode.INTERNAL)
        return _Abort(code, err.message, err.status, trailers)

    def _check_token(self, context, method: str, model: str = "") -> None:
        if method in OPEN_METHODS or not self.front.guard.enabled:
            return
        headers = [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in context.invocation_metadata()]
        problem = self.front.guard.problem(headers)
        if problem is not None:
            self.plane.metrics.count_error(model, "unauthorized")
            message = problem[0].replace("'Authorization: Bearer <token>'", "metadata 'authorization: Bearer <token>'")
            raise _Abort(self.front.grpc.StatusCode.UNAUTHENTICATED, message.replace("header", "metadata"), 401)

    async def _answer(
        self, context, method: str, account: RequestAccount, handler: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run ``handler()``; turn refusals into their status and anything unexpected into INTERNAL.

        ``account`` (:mod:`._accounting`, as the HTTP front keeps it) counts the refusal or the
        failure and gets the HTTP equivalent of the answer as its status.
        """
        try:
            self._check_token(context, method, account.model)
            response = await handler()
            account.status = 200
            return response
        except _Abort as err:
            abort = err
        except RequestError as err:
            account.refused(err)
            abort = self._abort_of(err)
        except Exception as err:
            account.failed(f"gRPC {method}")
            abort = _Abort(self.front.grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}", 500)
        account.status = abort.status
        if abort.trailers:
            context.set_trailing_metadata(abort.trailers)
        await context.abort(abort.code, abort.message)

    async def _document(self, context, method: str, model: str, make: Callable[[], Any]) -> Any:
        """Answer a method whose response is built synchronously by ``make()`` (health, metadata, config)."""

        async def handler() -> Any:
            return make()

        return await self._answer(context, method, RequestAccount(self.plane.metrics, model, None), handler)

    # -- health and metadata ----------------------------------------------------------------------

    async def ServerLive(self, request, context):
        return await self._document(context, "ServerLive", "", lambda: self.pb2.ServerLiveResponse(live=True))

    async def ServerReady(self, request, context):
        return await self._document(
            context, "ServerReady", "", lambda: self.pb2.ServerReadyResponse(ready=self.plane.ready)
        )

    async def ModelReady(self, request, context):
        def ready():
            return self.pb2.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

        return await self._document(context, "ModelReady", request.name, ready)

    async def ServerMetadata(self, request, context):
        return await self._document(
            context, "ServerMetadata", "", lambda: self.pb2.ServerMetadataResponse(**self.plane.server_metadata())
        )

    async def ModelMetadata(self, request, context):
        def metadata():
            document = self.plane.model_metadata(request.name, request.version)
            tensor = self.pb2.ModelMetadataResponse.TensorMetadata
            return self.pb2.ModelMetadataResponse(
                name=document["name"],
                versions=document["versions"],
                platform=document["platform"],
                inputs=[tensor(**i) for i in document["inputs"]],
                outputs=[tensor(**o) for o in document["outputs"]],
            )  # the HTTP document's "parameters" have no field here

        return await self._document(context, "ModelMetadata", request.name, metadata)

    async def ModelConfig(self, request, context):
        def config():
            from google.protobuf import json_format

            document = self.plane.model_config(request.name, request.version)
            message = json_format.ParseDict(document, self.front.config_pb2.ModelConfig())
            return self.pb2.ModelConfigResponse(config=message)

        return await self._document(context, "ModelConfig", request.name, config)

    async def ModelStatistics(self, request, context):
        def statistics():
            from google.protobuf import json_format

            document = self.plane.statistics(request.name or None, request.version)
            return json_format.ParseDict(document, self.pb2.ModelStatisticsResponse())

        return await self._document(context, "ModelStatistics", request.name, statistics)

    async def RepositoryIndex(self, request, context):
        def index():
            entry = self.pb2.RepositoryIndexResponse.ModelIndex
            models = self.plane.repository_index(request.ready)
            return self.pb2.RepositoryIndexResponse(models=[entry(**m) for m in models])

        return await self._document(context, "RepositoryIndex", "", index)

    # -- inference --------------------------------------------------------------------------------

    async def ModelInfer(self, request, context):
        account = RequestAccount(self.plane.metrics, request.model_name, "grpc")
        account.status = 499  # stays so when the client cancels (or its deadline passes) mid-request
        try:
            return await self._answer(context, "ModelInfer", account, lambda: self._infer(request, account.started))
        finally:
            account.close()

    async def _infer(self, request, started: float):
        async with self.plane.inference(request.model_name, request.model_version, started) as call:
            parsed, items = await call.validate(grpc_items, request)
            outputs: Mapping[str, np.ndarray]
            if isinstance(items, VideoUpload):  # a clip model's encoded video (server/_video.py)
                outputs = await kserve_video(call, parsed, items)
            else:
                outputs = await call.infer(items, parsed.outputs)
            return infer_response(self.pb2, call.model.name, parsed, outputs, call.model.card.labels)
