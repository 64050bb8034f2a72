"""Request errors: one reason from a fixed set, an HTTP status, and a message naming the problem.

Every refusal the server makes is a :class:`RequestError`. Its ``reason`` is the value of the
``reason`` label of ``gpufeed_server_errors_total`` (a small fixed set, never user text); its
message names the request part at fault (which image, which field, which header) and what is
allowed. Responses are JSON ``{"error": message, "reason": reason}``; KServe v2 clients
(tritonclient) read the ``error`` field.

Text taken from a request (names, header values) is shown through :func:`shown`: bounded, and
with anything that cannot be encoded as UTF-8 (a lone surrogate decoded from JSON ``"\\ud800"``)
escaped, so a message can always be rendered. :func:`json_bytes` renders any response document the
same way, so no answer fails while it is being written.
"""

from __future__ import annotations

import json
import reprlib

__all__ = ["REASONS", "RequestError", "json_bytes", "shown"]

# reason -> HTTP status. The reasons are the metric label values of the serving contract.
REASONS: dict[str, int] = {
    "corrupt_image": 400,
    "unsupported_media_type": 415,
    "bad_shape": 400,
    "bad_dtype": 400,
    "too_many_pixels": 400,
    # A served video (server/_video.py): one that cannot be read or stops decoding, and one over the
    # frame or duration limits (serve.max_video_frames, serve.max_video_seconds).
    "corrupt_video": 400,
    "video_too_long": 400,
    "body_too_large": 413,
    "malformed_request": 400,
    "unknown_model": 404,
    "queue_full": 503,
    "timeout": 504,
    "unauthorized": 401,
    # The client closed the connection before its request was read whole: nobody is left to answer.
    # 499 is nginx's "client closed request"; it is a count, never a status sent to anyone.
    "client_disconnect": 499,
    "internal": 500,
}
"""Every refusal reason (the ``reason`` label of the error metrics) and its HTTP status."""


def _repr_engine() -> reprlib.Repr:
    engine = reprlib.Repr()  # bounded: a 10,000-element list shows its first few
    engine.maxlevel, engine.maxlist, engine.maxdict, engine.maxtuple = 3, 8, 6, 8
    engine.maxstring, engine.maxlong, engine.maxother = 80, 40, 80
    return engine


_REPR = _repr_engine()


def shown(value, limit: int = 120) -> str:
    """``repr`` of request text or values for messages: bounded, cheap, and always encodable as UTF-8."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer beyond Python's digit limit for str()
        text = f"<{type(value).__name__} holding an integer too long to print>"
    if len(text) > limit:
        text = f"{text[: limit - 3]}..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_bytes(document) -> bytes:
    """Compact UTF-8 JSON that never fails on strings from requests.

    A lone surrogate cannot be encoded as UTF-8; ``backslashreplace`` writes it as the six
    characters ``\\ud800``, which inside a JSON string is that very escape, so the output stays
    valid JSON and means what it says.
    """
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


class RequestError(Exception):
    """A request the server refuses, with the reason (metric label) and the HTTP status.

    Args:
        reason: One of :data:`REASONS`.
        message: What is wrong, naming the part of the request (image index, field, header).
        headers: Extra response headers (``Retry-After`` for ``queue_full``).
        status: Override the reason's usual status (e.g. 503 for a model that is not ready).
    """

    def __init__(self, reason: str, message: str, headers: dict[str, str] | None = None, status: int | None = None):
        if reason not in REASONS:
            raise ValueError(f"unknown error reason {reason!r}; allowed: {', '.join(REASONS)}")
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status or REASONS[reason]
        self.headers = dict(headers or {})

    @property
    def counted(self) -> bool:
        """Whether this refusal is counted in ``gpufeed_server_errors_total`` (not for a model still loading)."""
        return self.reason in REASONS

    def to_json(self) -> dict:
        return {"error": self.message, "reason": self.reason}

    def __reduce__(self):  # picklable with all its fields (errors raised in a worker process)
        return _rebuild, (type(self), self.__dict__)

    def __repr__(self) -> str:
        return f"RequestError({self.reason!r}, {self.message!r}, status={self.status})"


def _rebuild(cls, fields: dict) -> RequestError:
    err = cls.__new__(cls)
    Exception.__init__(err, fields["message"])
    err.__dict__.update(fields)
    return err
