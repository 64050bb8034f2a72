"""Access control: an optional bearer token in front of every endpoint but the health probes.

The token comes from a file named by ``serve.auth_token_file`` or from the ``GPUFEED_SERVE_TOKEN``
environment variable, never from the YAML config itself, so it is never saved with a run's outputs;
it is never logged or echoed either. Requests are checked by :class:`AccessGuard`, a plain ASGI
middleware that runs before routing and before a byte of the body is read, so an unauthenticated
client cannot make the server buffer a body, decode an image or queue work.

=====================================  =================================================================
path                                   needs the token (when one is configured)
=====================================  =================================================================
``/v2/health/live``, ``/v2/health/ready``  no: probes (kubelet, load balancers) carry no secrets, and
                                           they reveal nothing but "up" and "ready"
everything else                        yes: inference (``/v2/models/*/infer``, ``/v1/models/*/predict``),
                                       model metadata, configuration, statistics and readiness (they
                                       name the models), ``/v2``, ``/v2/repository/*``, ``/v1/models``,
                                       ``/metrics``, ``/openapi.json``
=====================================  =================================================================

A refusal is 401 with ``WWW-Authenticate: Bearer realm="gpufeed"`` (plus ``error="invalid_token"``
when a token was sent but is wrong, RFC 6750), a JSON ``{"error", "reason": "unauthorized"}`` body,
and a count in ``gpufeed_server_errors_total{reason="unauthorized"}``. Tokens are compared as
SHA-256 digests with :func:`hmac.compare_digest`: constant time, and the length is not leaked.

While the server drains (after SIGTERM) the guard also adds ``Connection: close`` to every
response, so clients do not keep idle connections that the shutdown would have to cut.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from gpufeed.server._http import JSONAnswer

__all__ = ["OPEN_PATHS", "TOKEN_ENV", "AccessGuard", "TokenError", "load_token", "route_of"]

log = logging.getLogger("gpufeed.server")

TOKEN_ENV = "GPUFEED_SERVE_TOKEN"
"""The environment variable :func:`load_token` reads the bearer token from."""
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
MIN_TOKEN_CHARS = 16
# RFC 6750 b64token: what may follow "Bearer " without quoting.
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
_PREDICT = re.compile(r"^/v1/models/([^/]+)/predict$")
_MODEL_PATH = re.compile(r"^/v[12]/models/([^/]+)")
_REALM = 'Bearer realm="gpufeed"'


class TokenError(ValueError):
    """The configured token cannot be used (the message names its source, never its value)."""


def _check_token(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.match(token):
        raise TokenError(
            f"the bearer token from {source} must be at least {MIN_TOKEN_CHARS} characters of "
            'A-Z a-z 0-9 - . _ ~ + / (RFC 6750); make one with: python -c "import secrets; '
            'print(secrets.token_urlsafe(32))"'
        )
    return token


def load_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token the server requires, or ``None`` when access is open.

    Args:
        token_file: ``serve.auth_token_file``: a file whose content (surrounding whitespace
            stripped) is the token.
        environ: Where to look for ``GPUFEED_SERVE_TOKEN`` (default: ``os.environ``).

    Raises:
        TokenError: Both sources are set, the file is unreadable or empty, or the token is too
            short or has characters a bearer token may not have.
    """
    from_env = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    if token_file is None:
        return _check_token(from_env, f"${TOKEN_ENV}") if from_env else None
    if from_env:
        raise TokenError(f"both serve.auth_token_file and ${TOKEN_ENV} are set; set only one")
    path = Path(token_file)
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise TokenError(f"cannot read serve.auth_token_file {path}: {getattr(err, 'strerror', None) or err}") from None
    if not text:
        raise TokenError(f"serve.auth_token_file {path} is empty")
    try:
        if path.stat().st_mode & 0o077:
            log.warning("serve.auth_token_file %s is readable by other users; chmod 600 it", path)
    except OSError:
        pass
    return _check_token(text, f"serve.auth_token_file {path}")


def route_of(path: str) -> tuple[str, str | None]:
    """``(model name or "", protocol)`` of a request path; protocol is None for non-inference paths."""
    for pattern, protocol in ((_INFER, "kserve"), (_PREDICT, "rest")):
        match = pattern.match(path)
        if match:
            return match.group(1), protocol
    match = _MODEL_PATH.match(path)
    return (match.group(1) if match else ""), None


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token if isinstance(token, bytes) else token.encode()).digest()


class AccessGuard:
    """ASGI middleware: bearer-token check (when ``token`` is set) and ``Connection: close`` while draining.

    Args:
        app: The wrapped ASGI app.
        state: The :class:`~gpufeed.server._state.ServingState` (metrics, draining flag).
        token: The required token, or ``None`` for open access.
    """

    def __init__(self, app, state, token: str | None) -> None:
        self.app, self.state = app, state
        self._digest = None if token is None else _digest(token)

    @property
    def enabled(self) -> bool:
        return self._digest is not None

    def problem(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
        """``None`` when the request carries the right token, else (message, WWW-Authenticate).

        Args:
            headers: Lower-case names and values, as ASGI gives them (the gRPC front end passes its metadata).
        """
        if self._digest is None:  # open access
            return None
        values = [v for k, v in headers if k == b"authorization"]
        if not values:
            return "this endpoint needs 'Authorization: Bearer <token>' (serve.auth_token_file)", _REALM
        scheme, _, supplied = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return "the Authorization header must use the Bearer scheme: 'Authorization: Bearer <token>'", _REALM
        if not supplied.strip():
            return "the Authorization header has no token after 'Bearer'", _REALM
        if len(values) > 1 or not hmac.compare_digest(_digest(supplied.strip()), self._digest):
            return "the bearer token is not valid", f'{_REALM}, error="invalid_token"'
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._digest is not None and scope["path"] not in OPEN_PATHS:
            problem = self.problem(scope["headers"])
            if problem is not None:
                await self._refuse(scope, receive, send, *problem)
                return
        if self.state.closing:
            send = _closing(send)
        await self.app(scope, receive, send)

    async def _refuse(self, scope, receive, send, message: str, challenge: str) -> None:
        # Counted by reason here; the answer itself is counted by the accounting layer around this one.
        self.state.metrics.count_error(route_of(scope["path"])[0], "unauthorized")
        response = JSONAnswer(
            {"error": message, "reason": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": challenge}
        )
        await response(scope, receive, send)


def _closing(send):
    async def send_with_close(message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return send_with_close
