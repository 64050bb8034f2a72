"""The app's outermost layer: every answer is JSON, counted and timed, whatever happened inside.

:class:`Accounting` wraps the whole ASGI app (access control, routing, handlers):

* every answer to an inference path (``/v2/models/NAME[/versions/V]/infer``,
  ``/v1/models/NAME/predict``) is counted in ``gpufeed_server_requests_total`` with the status it
  got, and timed in ``gpufeed_server_request_seconds``, from the moment the request head was
  parsed to the moment the answer started; refusals by the access check and by routing included;
* an exception that escapes a handler is logged once with its traceback, counted with reason
  ``internal`` and answered with a JSON 500, instead of Starlette's plain-text one (which
  uvicorn would log as "Exception in ASGI application" and no metric would see);
* a request whose client hung up before its body arrived is counted as a 499 with reason
  ``client_disconnect`` (by the handler that noticed), never as a server error.

Refusals are counted by reason in ``gpufeed_server_errors_total`` where they are made (one
:class:`~gpufeed.server.RequestError` handler for all routes, the access guard, the 404/405
handler); this layer only adds the ``internal`` ones it catches.
"""

from __future__ import annotations

import logging
import time

from gpufeed.server._access import route_of
from gpufeed.server._errors import shown
from gpufeed.server._http import JSONAnswer

__all__ = ["Accounting"]

log = logging.getLogger("gpufeed.server")


class Accounting:
    """ASGI middleware: counts and times inference answers, and turns escaped exceptions into JSON 500s.

    Args:
        app: The wrapped ASGI app.
        metrics: The server's :class:`~gpufeed.server._metrics.ServerMetrics`.
    """

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        name, protocol = route_of(scope["path"])
        status = 0

        async def send_tracked(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as err:
            log.exception("internal error handling %s %s", scope.get("method", "?"), shown(scope["path"], 200))
            self.metrics.count_error(name, "internal")
            if status == 0:  # nothing sent yet: the client still gets a JSON answer
                answer = JSONAnswer({"error": f"internal error: {type(err).__name__}", "reason": "internal"}, 500)
                try:
                    await answer(scope, receive, send_tracked)
                except Exception:  # the connection is gone as well; the error is counted
                    status = status or 500
        if protocol is not None:
            self.metrics.observe_request(name, protocol, status or 500, time.perf_counter() - started)
