"""Starting the server: bind the socket, run uvicorn (in this thread or a background one), stop cleanly.

``start_server`` is for programs and tests: it returns once the server is ready (models loaded
and warmed up) with its URL; ``RunningServer.stop()`` drains and stops it. ``serve_forever`` is
the CLI's blocking variant: SIGINT/SIGTERM make uvicorn stop accepting, let in-flight requests
finish (``timeout_graceful_shutdown``), and the lifespan hook drains the batchers.

The socket is bound before uvicorn starts, so port 0 (a free port) works and the bound address is
known (and printed) before the first request.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunningServer", "ServerStartError", "serve_forever", "start_server"]

log = logging.getLogger("gpufeed.server")


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


def _prepare(repo, model, cfg, host, port, device):
    import uvicorn

    from gpufeed.device import resolve_device
    from gpufeed.server._app import build_app
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    entries = load_repository(repo, model)  # fails fast, naming the folder, before binding
    choice = device if device is not None else resolve_device(cfg.device)
    state = ServingState(entries, cfg.serve, choice)
    host = host or cfg.serve.host
    port = cfg.serve.port if port is None else port
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    app = build_app(state)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(max(1, cfg.serve.request_timeout_seconds)),
    )
    url_host = f"[{host}]" if ":" in host else host
    return state, uvicorn.Server(config), sock, f"http://{url_host}:{bound}", bound


@dataclass
class RunningServer:
    """A server running on a background thread."""

    url: str
    port: int
    state: object
    server: object
    thread: threading.Thread
    sock: socket.socket

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, let requests finish, drain the batchers, join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()


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
) -> RunningServer:
    """Serve a model repository (or one model folder) on a background thread; return when ready.

    Args:
        repo, model: Exactly one: a repository folder, or one model folder.
        cfg: A :class:`gpufeed.config.Config` (its ``serve`` section and ``device``); default: defaults.
        host, port: Override ``serve.host`` / ``serve.port`` (port 0: a free port).
        device: A :class:`~gpufeed.device.DeviceChoice` to use instead of resolving ``cfg.device``.

    Raises:
        ServerStartError: Binding failed, or a model failed to load or warm up (with why).
        gpufeed.server.ModelRepoError: The repository or a model card is invalid.
    """
    from gpufeed.config import Config

    cfg = cfg or Config()
    state, server, sock, url, bound = _prepare(repo, model, cfg, host, port, device)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gpufeed-uvicorn", daemon=True)
    thread.start()
    running = RunningServer(url, bound, state, server, thread, sock)
    deadline = time.monotonic() + ready_timeout
    if not state.loaded.wait(ready_timeout):
        running.stop()
        raise ServerStartError(f"the models were not loaded within {ready_timeout:g} s")
    if state.load_error is not None:
        running.stop()
        raise ServerStartError(f"a model failed to load: {state.load_error}") from state.load_error
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    if not server.started:
        running.stop()
        raise ServerStartError("uvicorn did not start")
    return running


def serve_forever(
    repo: str | Path | None = None,
    model: str | Path | None = None,
    cfg=None,
    *,
    host: str | None = None,
    port: int | None = None,
    announce=print,
) -> None:
    """Serve in this thread until SIGINT/SIGTERM (the ``gpufeed serve`` command).

    Raises:
        ServerStartError: As :func:`start_server`.
    """
    from gpufeed.config import Config

    cfg = cfg or Config()
    state, server, sock, url, _ = _prepare(repo, model, cfg, host, port, None)
    names = ", ".join(state.entries)
    announce(f"gpufeed serve: listening on {url} (models: {names}); ready at {url}/v2/health/ready once warmed up")
    threading.Thread(target=_watch_loading, args=(state, server), daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if state.load_error is not None:
        raise ServerStartError(f"a model failed to load: {state.load_error}") from state.load_error
