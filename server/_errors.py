"""Request errors: one reason from a fixed set, an HTTP status, and a message naming the problem.

Every refusal the server makes is a :class:`RequestError`. Its ``reason`` is the value of the
``reason`` label of ``gpufeed_server_errors_total`` (a small fixed set, never user text); its
message names the request part at fault (which image, which field, which header) and what is
allowed. Responses are JSON ``{"error": message, "reason": reason}``; KServe v2 clients
(tritonclient) read the ``error`` field.
"""

from __future__ import annotations

__all__ = ["REASONS", "RequestError"]

# reason -> HTTP status. The reasons are the metric label values of the serving contract.
REASONS: dict[str, int] = {
    "corrupt_image": 400,
    "unsupported_media_type": 415,
    "bad_shape": 400,
    "bad_dtype": 400,
    "too_many_pixels": 400,
    "body_too_large": 413,
    "malformed_request": 400,
    "unknown_model": 404,
    "queue_full": 503,
    "timeout": 504,
    "unauthorized": 401,
    "internal": 500,
}


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

    def to_json(self) -> dict:
        return {"error": self.message, "reason": self.reason}

    def __repr__(self) -> str:
        return f"RequestError({self.reason!r}, {self.message!r}, status={self.status})"
