"""Starting the server: bind the socket, run uvicorn (in this thread or a background one), stop cleanly.

``start_server`` is for programs and tests: it returns once the server is ready (models loaded
and warmed up) with its URL; ``RunningServer.stop()`` drains and stops it. ``serve_forever`` is
the CLI's blocking variant and returns the exit status.

Graceful shutdown (SIGTERM or SIGINT, or ``RunningServer.stop()``), by :class:`DrainingServer`:

1. readiness turns false at once (``/v2/health/ready`` 503) and every request that arrives from
   then on gets 503 ``not_ready`` with Retry-After, still over the open socket, so probes and
   load balancers can see it; responses carry ``Connection: close``;
2. after ``serve.shutdown_delay_seconds``, once every admitted request has its answer (bounded
   by ``serve.request_timeout_seconds``: a request that waits longer has had its 504), uvicorn
   stops accepting, closes idle connections, and the model server (:mod:`._server`) releases the models;
3. the process exits 0. uvicorn would re-raise the signal after a graceful shutdown (exit status
   143 for SIGTERM); a drain that answered everything is a success, so it exits 0 instead. A
   second signal forces the exit at once (status 128 + the signal), and a drain that timed out
   with requests unanswered exits 1.

The socket is bound before uvicorn starts, so port 0 (a free port) works and the bound address is
known (and printed) before the first request. With a gRPC port (``serve.grpc_port``, ``--grpc-port``)
KServe v2 over gRPC (:mod:`._grpc`) is started beside HTTP, as its peer, by
:class:`~gpufeed.server._server.ModelServer` on the same event loop; it is drained with HTTP (new
calls UNAVAILABLE, calls in flight answered) and stopped before the models are released.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gpufeed.config import Config, ServeConfig
from gpufeed.device import resolve_device
from gpufeed.server._access import load_token
from gpufeed.server._app import build_app
from gpufeed.server._dataplane import DataPlane
from gpufeed.server._offload import ParsePool
from gpufeed.server._protocol import http_protocol
from gpufeed.server._repo import load_repository
from gpufeed.server._server import ModelServer
from gpufeed.server._state import ServingState

__all__ = ["RunningServer", "ServerStartError", "serve_forever", "start_server"]

log = logging.getLogger("gpufeed.server")

# How much longer than serve.request_timeout_seconds the drain waits for requests in flight: a
# request past its timeout has had its 504 by then, and this covers writing it out.
DRAIN_SLACK_SECONDS = 5.0


def graceful_shutdown_seconds(serve: ServeConfig) -> int:
    """uvicorn's wait for open connections and tasks once the drain is done (``serve.request_timeout_seconds``)."""
    return int(max(1, serve.request_timeout_seconds))


def longest_drain_seconds(serve: ServeConfig) -> float:
    """The longest a graceful shutdown waits, from the first SIGTERM to the models' release.

    ``serve.shutdown_delay_seconds``, then the requests in flight (at most
    ``request_timeout_seconds`` + :data:`DRAIN_SLACK_SECONDS`), then uvicorn's own graceful
    shutdown (:func:`graceful_shutdown_seconds`). Releasing the models and the gRPC server's
    one-second grace come after it. A supervisor that kills the process (Kubernetes'
    ``terminationGracePeriodSeconds``) must allow more than this, or an answer may be cut off.

    Args:
        serve: The ``serve`` config section (:class:`gpufeed.config.ServeConfig`).
    """
    in_flight_s = serve.request_timeout_seconds + DRAIN_SLACK_SECONDS
    return serve.shutdown_delay_seconds + in_flight_s + graceful_shutdown_seconds(serve)


class ServerStartError(RuntimeError):
    """The server could not start: the address is taken, or a model failed to load or warm up."""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before the shutdown, and exit status 0 for a graceful one.

    uvicorn closes its listening socket the moment a signal arrives, so nobody could see readiness
    turn false, and then re-raises the signal. Here the first signal starts :meth:`drain` on a
    thread instead (the signal handler must return at once); uvicorn's own shutdown follows only
    once the drain is done. The signal is not recorded for re-raising.
    """

    def __init__(self, config, state) -> None:
        super().__init__(config)
        self.state = state
        self.exit_status = 0
        self._drain_started = threading.Event()

    def handle_exit(self, sig: int, frame) -> None:  # called by the signal handlers uvicorn installs
        if self._drain_started.is_set():
            log.warning("second signal (%s): exiting now, without waiting for requests in flight", _signal_name(sig))
            self.exit_status = 128 + int(sig)
            self.force_exit = self.should_exit = True
            return
        log.info("%s: draining", _signal_name(sig))
        threading.Thread(target=self.drain, name="gpufeed-drain", daemon=True).start()

    def drain(self) -> None:
        """Refuse new work, wait out the delay and the requests in flight, then let uvicorn stop."""
        if self._drain_started.is_set():
            return
        self._drain_started.set()
        cfg = self.state.cfg
        self.state.begin_drain()
        time.sleep(cfg.shutdown_delay_seconds)
        deadline = time.monotonic() + cfg.request_timeout_seconds + DRAIN_SLACK_SECONDS
        while self.state.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.state.inflight > 0:
            log.error("drain timed out with %d request(s) unanswered", self.state.inflight)
            self.exit_status = max(self.exit_status, 1)
        self.should_exit = True


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _grpc_port_of(cfg, grpc_port: int | None) -> int | None:
    """The gRPC port to serve on: the argument (0: a free one) if given, else ``serve.grpc_port`` (0: off)."""
    if grpc_port is not None:
        return grpc_port
    return cfg.serve.grpc_port or None


def _prepare(repo, model, cfg, host, port, device, grpc_port=None, announce=None):
    grpc_port = _grpc_port_of(cfg, grpc_port)
    if grpc_port is not None:
        try:  # before loading anything: the message names the extra to install
            # Deferred: gpufeed.server._grpc imports the optional grpc extra (grpcio, tritonclient[grpc]).
            from gpufeed.server._grpc import require_grpc

            require_grpc()
        except ImportError as err:
            raise ServerStartError(str(err)) from None
    entries = load_repository(repo, model)  # fails fast, naming the folder, before binding
    try:
        token = load_token(cfg.serve.auth_token_file)
    except ValueError as err:
        raise ServerStartError(str(err)) from None
    choice = device if device is not None else resolve_device(cfg.device)
    state = ServingState.from_config(entries, cfg, choice)
    host = host or cfg.serve.host
    port = cfg.serve.port if port is None else port
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    if grpc_port:  # a port taken is refused now, in one line, before any model loads (gRPC binds it later)
        try:
            _bind(host, grpc_port).close()
        except ServerStartError as err:
            sock.close()
            raise ServerStartError(str(err).replace("cannot listen on", "cannot listen for gRPC on")) from None
    if token is None and not _is_loopback(host):
        log.warning(
            "serving on %s without a bearer token: anyone who can reach this address can use every endpoint "
            "(set serve.auth_token_file or GPUFEED_SERVE_TOKEN)",
            host,
        )
    plane = DataPlane(state, ParsePool())
    app = build_app(state, token=token, plane=plane)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_shutdown_seconds(cfg.serve),
        **http_protocol(
            cfg.serve.max_header_bytes,
            cfg.serve.header_timeout_seconds,
            lambda reason: state.metrics.count_error("", reason),
        ),
    )
    url_host = f"[{host}]" if ":" in host else host
    server = DrainingServer(config, state)
    peers = ModelServer(state, plane, server, grpc_port=grpc_port, grpc_host=host, token=token, announce=announce)
    return state, server, sock, f"http://{url_host}:{bound}", bound, peers


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class RunningServer:
    """A server running on a background thread."""

    url: str
    port: int
    state: ServingState
    server: DrainingServer
    thread: threading.Thread
    sock: socket.socket
    grpc_port: int | None = None  # the bound gRPC port, when gRPC is served

    def stop(self, timeout: float = 30.0) -> None:
        """Drain as on SIGTERM (readiness false, requests in flight answered), then stop and join."""
        self.server.drain()
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()


def _run_in_thread(peers: ModelServer, sock) -> None:
    # uvicorn answers a failed startup with SystemExit; start_server reports why.
    with contextlib.suppress(SystemExit):
        peers.run([sock])


def _watch_loading(state, server) -> None:
    state.loaded.wait()
    if state.load_error is not None:
        server.should_exit = True


def start_server(
    repo: str | Path | None = None,
    model: str | Path | None = None,
    cfg=None,
    *,
    host: str | None = None,
    port: int | None = None,
    device=None,
    ready_timeout: float = 300.0,
    grpc_port: int | None = None,
) -> RunningServer:
    """Serve a model repository (or one model folder) on a background thread; return when ready.

    Args:
        repo, model: Exactly one: a repository folder, or one model folder.
        cfg: A :class:`gpufeed.config.Config` (its ``serve`` section and ``device``); default: defaults.
        host, port: Override ``serve.host`` / ``serve.port`` (port 0: a free port).
        device: A :class:`~gpufeed.device.DeviceChoice` to use instead of resolving ``cfg.device``.
        grpc_port: Also serve KServe v2 over gRPC on this port (0: a free one; the bound port is
            ``RunningServer.grpc_port``); ``None``: as ``serve.grpc_port`` says.

    Raises:
        ServerStartError: Binding failed, or a model failed to load or warm up (with why).
        gpufeed.server.ModelRepoError: The repository or a model card is invalid.
    """
    cfg = cfg or Config()
    state, server, sock, url, bound, peers = _prepare(repo, model, cfg, host, port, device, grpc_port)
    thread = threading.Thread(target=_run_in_thread, args=(peers, sock), name="gpufeed-uvicorn", daemon=True)
    thread.start()
    running = RunningServer(url, bound, state, server, thread, sock)
    deadline = time.monotonic() + ready_timeout
    while not state.loaded.wait(0.05):
        # The server's start failed (the gRPC port could not be bound): loading never starts.
        if peers.start_error is not None or not thread.is_alive():
            running.stop()
            raise ServerStartError(str(peers.start_error or "uvicorn stopped before the models were loaded"))
        if time.monotonic() > deadline:
            running.stop()
            raise ServerStartError(f"the models were not loaded within {ready_timeout:g} s")
    if state.load_error is not None:
        running.stop()
        raise ServerStartError(f"a model failed to load: {state.load_error}") from state.load_error
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    if not server.started:
        running.stop()
        if peers.start_error is not None:
            raise ServerStartError(str(peers.start_error))
        raise ServerStartError("uvicorn did not start")
    if peers.grpc is not None:
        running.grpc_port = peers.grpc.port
    return running


def serve_forever(
    repo: str | Path | None = None,
    model: str | Path | None = None,
    cfg=None,
    *,
    host: str | None = None,
    port: int | None = None,
    grpc_port: int | None = None,
    announce=print,
) -> int:
    """Serve in this thread until SIGINT/SIGTERM (the ``gpufeed serve`` command); return the exit status.

    Returns:
        0 after a graceful drain (every admitted request answered); 1 if the drain timed out with
        requests unanswered; 128 + the signal number when a second signal forced the exit.

    Raises:
        ServerStartError: As :func:`start_server`.
    """
    cfg = cfg or Config()
    state, server, sock, url, _, peers = _prepare(repo, model, cfg, host, port, None, grpc_port, announce)
    names = ", ".join(state.entries)
    announce(f"gpufeed serve: listening on {url} (models: {names}); ready at {url}/v2/health/ready once warmed up")
    threading.Thread(target=_watch_loading, args=(state, server), daemon=True).start()
    try:
        peers.run([sock])
    finally:
        sock.close()
    if state.load_error is not None:
        raise ServerStartError(f"a model failed to load: {state.load_error}") from state.load_error
    if peers.start_error is not None:
        raise ServerStartError(str(peers.start_error))
    return server.exit_status
