"""The model server: the HTTP and gRPC fronts started as peers over one data plane, on one event loop.

As KServe's model server starts its REST and gRPC servers side by side, :class:`ModelServer` owns
what lies below both fronts and their life cycle, so neither front starts the other:

1. **start**: the gRPC front (:mod:`._grpc`, with ``grpc_port``) binds and serves (a port that
   cannot be bound is a start error, :attr:`ModelServer.start_error`); the models start loading on
   a background thread (:meth:`~gpufeed.server._state.ServingState.start_loading`); the HTTP front
   (the Starlette app of :mod:`._app`, run by uvicorn) serves its socket;
2. **serve** until the HTTP front stops: SIGTERM's drain (``DrainingServer``, :mod:`._launch`) waits
   for the requests in flight of both fronts (they all count in ``state.inflight``), a second
   signal, ``RunningServer.stop()``, or a model that failed to load;
3. **stop**: the gRPC front stops (its calls in flight were answered by the drain), the models are
   drained and released, the parser threads and worker process are closed.

Both fronts answer from one :class:`~gpufeed.server._dataplane.DataPlane`: the models' batchers,
the parser threads, the limits, the token, the metrics and the drain are shared.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvicorn

from gpufeed.server._dataplane import DataPlane
from gpufeed.server._state import ServingState

if TYPE_CHECKING:
    from gpufeed.server._grpc import GrpcFront

__all__ = ["ModelServer"]

log = logging.getLogger("gpufeed.server")


class _OnUvicornsLoop(uvicorn.Server):
    """Runs ``main`` where uvicorn would run its server: the event loop its config picks (uvloop when
    installed), set up as each supported uvicorn version sets it up."""

    def __init__(self, config: uvicorn.Config, main) -> None:
        super().__init__(config)
        self._main = main

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await self._main(sockets)


class ModelServer:
    """The server's two fronts as peers over one data plane (see the module docs).

    Args:
        state: The models and their life cycle.
        plane: The data plane both fronts answer from.
        http: The HTTP front: a uvicorn server (``DrainingServer``) running the app of :mod:`._app`.
        grpc_port: Also serve KServe v2 over gRPC on this port (0: a free one); ``None``: HTTP only.
        grpc_host: Where gRPC listens.
        token: The bearer token gRPC requires (HTTP's guard has its own), ``None``: open access.
        announce: Called with a line naming the gRPC address once it is bound.

    Attributes:
        grpc: The gRPC front once started (its ``port`` is the bound one), else ``None``.
        start_error: Why the server could not start (the gRPC port could not be bound), else ``None``.
    """

    def __init__(
        self,
        state: ServingState,
        plane: DataPlane,
        http: uvicorn.Server,
        *,
        grpc_port: int | None = None,
        grpc_host: str = "127.0.0.1",
        token: str | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.state, self.plane, self.http = state, plane, http
        self.grpc_port, self.grpc_host, self.token, self.announce = grpc_port, grpc_host, token, announce
        self.grpc: GrpcFront | None = None
        self.start_error: BaseException | None = None

    async def _start_grpc(self) -> None:
        # Deferred: gpufeed.server._grpc imports the optional grpc extra (grpcio, tritonclient[grpc]).
        from gpufeed.server._grpc import GrpcFront

        front = GrpcFront(self.plane, self.token, self.grpc_host, self.grpc_port or 0, self.announce)
        await front.start()
        self.grpc = front

    async def serve(self, sockets: list[socket.socket]) -> None:
        """Start both fronts, serve until the HTTP front stops, then stop everything (a start error is
        kept in :attr:`start_error`, not raised)."""
        try:
            if self.grpc_port is not None:
                try:
                    await self._start_grpc()
                except Exception as err:  # start_server and serve_forever report it in one line
                    self.start_error = err
                    log.error("%s", err)
                    return
            self.state.start_loading()
            await self.http.serve(sockets=sockets)
        finally:
            await self._stop()

    async def _stop(self) -> None:
        # Graceful shutdown: no new requests, queued ones finish, then the models go. The drain
        # has already waited for gRPC requests in flight (they count in state.inflight).
        if self.grpc is not None:
            await self.grpc.stop(grace=1.0)
        await asyncio.get_running_loop().run_in_executor(None, self.state.close)
        self.plane.pool.close()
        self.plane.close()

    def run(self, sockets: list[socket.socket]) -> None:
        """:meth:`serve` in this thread, on the event loop uvicorn picks, until the server stops."""
        _OnUvicornsLoop(self.http.config, self.serve).run(sockets)
