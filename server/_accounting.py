"""Request accounting, one rule for every front: refusals by reason, unexpected exceptions, answers counted and timed.

:class:`RequestAccount` is one request's account, kept the same way by the HTTP front (the
:class:`Accounting` middleware) and the gRPC front (:mod:`._grpc`):

* a refusal (:class:`~gpufeed.server.RequestError`) is counted by reason in
  ``gpufeed_server_errors_total`` where it is made (:func:`count_refusal`; a model still loading or
  a draining server is not a refusal);
* an exception that escapes a handler is logged once with its traceback and counted with reason
  ``internal``; HTTP answers it with a JSON 500 instead of Starlette's plain-text one (which
  uvicorn would log as "Exception in ASGI application" and no metric would see), gRPC with INTERNAL;
* every answer to an inference request (``/v2/models/NAME[/versions/V]/infer``,
  ``/v1/models/NAME/predict``, gRPC ``ModelInfer``) is counted once in
  ``gpufeed_server_requests_total`` with the (HTTP) status it got and timed in
  ``gpufeed_server_request_seconds``, from the moment the request arrived to the moment the
  answer started; over HTTP, refusals by the access check and by routing included;
* a request whose client hung up first is counted as a 499 with reason ``client_disconnect`` (by
  the handler that noticed), never as a server error.
"""

from __future__ import annotations

import logging
import time

from gpufeed.server._access import route_of
from gpufeed.server._errors import REASONS, RequestError, shown
from gpufeed.server._http import JSONAnswer

__all__ = ["Accounting", "RequestAccount", "count_refusal"]

log = logging.getLogger("gpufeed.server")


def count_refusal(metrics, model: str, err: RequestError) -> None:
    """Count a refusal by its reason (a model still loading, or a draining server, is not one)."""
    if err.reason in REASONS:
        metrics.count_error(model, err.reason)


class RequestAccount:
    """One request's account (see the module docs).

    Args:
        metrics: The server's :class:`~gpufeed.server._metrics.ServerMetrics`.
        model: The model the request names (``""``: none).
        protocol: ``kserve``, ``rest`` or ``grpc`` for an inference request (counted and timed
            once by :meth:`close`); ``None`` for any other.
        started: When the request arrived (``time.perf_counter()``; default: now).

    Attributes:
        status: The (HTTP) status of the answer, 0 until one is known (then counted as 500).
    """

    def __init__(self, metrics, model: str, protocol: str | None, started: float | None = None) -> None:
        self.metrics, self.model, self.protocol = metrics, model, protocol
        self.started = time.perf_counter() if started is None else started
        self.status = 0

    def refused(self, err: RequestError) -> None:
        """The request is refused with ``err``: counted by reason, its status noted."""
        count_refusal(self.metrics, self.model, err)
        self.status = err.status

    def failed(self, what: str) -> None:
        """An exception escaped the handler of ``what``: logged with its traceback, counted as ``internal``."""
        log.exception("internal error handling %s", what)
        self.metrics.count_error(self.model, "internal")

    def close(self) -> None:
        """Count and time the answer of an inference request (once, whatever happened)."""
        if self.protocol is not None:
            seconds = time.perf_counter() - self.started
            self.metrics.observe_request(self.model, self.protocol, self.status or 500, seconds)


class Accounting:
    """ASGI middleware: keeps each HTTP request's :class:`RequestAccount`, and turns escaped exceptions into JSON 500s.

    Args:
        app: The wrapped ASGI app (access control, routing, handlers).
        metrics: The server's :class:`~gpufeed.server._metrics.ServerMetrics`.
    """

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        account = RequestAccount(self.metrics, *route_of(scope["path"]))

        async def send_tracked(message) -> None:
            if message["type"] == "http.response.start":
                account.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as err:
            account.failed(f"{scope.get('method', '?')} {shown(scope['path'], 200)}")
            if account.status == 0:  # nothing sent yet: the client still gets a JSON answer
                answer = JSONAnswer({"error": f"internal error: {type(err).__name__}", "reason": "internal"}, 500)
                try:
                    await answer(scope, receive, send_tracked)
                except Exception:  # the connection is gone as well; the error is counted
                    account.status = account.status or 500
        account.close()
