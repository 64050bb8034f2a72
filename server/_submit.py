"""What the HTTP app and the gRPC front share below both: submitting to a batcher, Triton's model config.

Both front ends turn a request into validated batch items, then call :func:`submit_and_wait`, so
queue-full, timeout and cancellation behave the same whichever protocol a client speaks.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from gpufeed.server._batcher import BatcherClosedError, QueueFullError
from gpufeed.server._errors import RequestError
from gpufeed.server._state import NotReadyError, ServingState
from gpufeed.server._triton import model_config

__all__ = ["model_config_of", "seconds_left", "submit_and_wait"]


def seconds_left(cfg, started: float) -> float:
    """Seconds of ``serve.request_timeout_seconds`` left to a request that started at ``started``."""
    return cfg.request_timeout_seconds - (time.perf_counter() - started)


async def submit_and_wait(cfg, model, items, started: float) -> list[np.ndarray]:
    """Queue validated items on the model's batcher and wait for their logits (HTTP and gRPC share this).

    Raises:
        RequestError: ``queue_full`` (503 + Retry-After) or ``timeout`` (504, after
            ``serve.request_timeout_seconds`` from ``started``).
        NotReadyError: The batcher is closed (the server is stopping).
    """
    try:
        futures = model.batcher.submit(items)
    except QueueFullError as err:
        raise RequestError(
            "queue_full",
            f"model {model.name!r} is at capacity ({err.depth} of {err.capacity} images queued); retry later",
            headers={"Retry-After": str(cfg.retry_after_seconds)},
        ) from None
    except BatcherClosedError as err:
        raise NotReadyError(str(err)) from None
    waiters = [asyncio.wrap_future(f) for f in futures]
    try:
        return await asyncio.wait_for(asyncio.gather(*waiters), max(seconds_left(cfg, started), 0.001))
    except asyncio.TimeoutError:
        model.batcher.cancel(futures)
        raise RequestError(
            "timeout", f"no answer within {cfg.request_timeout_seconds:g} s (serve.request_timeout_seconds)"
        ) from None
    except asyncio.CancelledError:  # the server is stopping the task (or a gRPC client left): free the queue slots
        model.batcher.cancel(futures)
        raise


def model_config_of(state: ServingState, name: str) -> dict:
    """Triton's model configuration of served model ``name`` (JSON form), loaded or not yet."""
    cfg, model = state.cfg, state.models.get(name)
    on_gpu = model.on_gpu if model is not None else state.device.is_gpu
    workers = model.workers if model is not None else cfg.workers_per_model or 2
    card, sizes = state.entries[name].card, getattr(model, "batch_sizes", None)
    return model_config(
        name, card, cfg, on_gpu=on_gpu, device_id=state.device.device_id, workers=workers, batch_sizes=sizes
    )
