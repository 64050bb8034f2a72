"""The data plane: the one request path below both front ends (HTTP in :mod:`._app`, gRPC in :mod:`._grpc`).

A front end only translates its wire format; everything else a request needs is asked of
:class:`DataPlane`, so HTTP KServe, REST and gRPC clients get the same checks, limits, readiness,
metrics and refusals, word for word:

* **inference**: ``async with plane.inference(name, version) as call`` counts the request as in
  flight (the drain waits for it) and resolves the ready model (404 unknown, 503 loading or
  draining); :meth:`Inference.validate` runs the front's parser (:mod:`._requests`) on a
  :class:`~gpufeed.server._offload.ParsePool` thread (:meth:`Inference.prepare`: a parser that
  moves its own steps, KServe HTTP's), timed as the ``preprocess`` stage;
  :meth:`Inference.infer` queues the items on the model's batcher, waits for their logits (the
  only place in the server that submits to a batcher: queue-full, timeout and cancellation behave
  the same for every protocol) and returns the model's output tensors, made by its task head
  (:class:`~gpufeed.models.Outputs`: KServe's ``logits`` and ``scores``, or a dense model's maps);
  the front only encodes them in its protocol, and leaving the block records the answer
  (``postprocess`` stage and Triton's statistics). A served video (:mod:`._video`) is scored on one
  of the plane's video threads, whose windows go through :meth:`Inference.infer_rows`, the blocking
  twin of ``infer`` (same batcher, same refusals);
* **readiness and documents**: server and model readiness (one rule,
  :meth:`~gpufeed.server._state.ServingState.model_state`), server and model metadata, Triton's
  model configuration, statistics and repository index.

Refusals are :class:`~gpufeed.server._errors.RequestError`; each front turns them into its
status (HTTP code, gRPC status) and counts them by reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from gpufeed import __version__
from gpufeed.models import Outputs
from gpufeed.server._batcher import BatcherClosedError, QueueFullError
from gpufeed.server._errors import RequestError, shown
from gpufeed.server._items import Item
from gpufeed.server._kserve import RequestedOutput
from gpufeed.server._model import ServedModel
from gpufeed.server._offload import ParsePool
from gpufeed.server._requests import kserve_inputs
from gpufeed.server._state import NotReadyError, ServingState
from gpufeed.server._triton import EXTENSIONS, input_facts, model_config_of, repository_index, served_outputs
from gpufeed.server._video import video_facts

__all__ = ["DataPlane", "Inference"]

T = TypeVar("T")

# How long a video's windows wait for room in a full queue before the request is refused.
QUEUE_WAIT_S = 1.0


async def _call_now(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the event loop, awaitable like :meth:`ParsePool.run`."""
    return fn(*args)


def _only_version_1(name: str, version: str) -> None:
    if version not in ("", "1"):  # gRPC sends "" for "the latest"
        raise RequestError("unknown_model", f"model {name!r} has only version 1")


class Inference:
    """One inference request on its way through the data plane (made by :meth:`DataPlane.inference`).

    Attributes:
        model: The ready model the request names.
        started: ``time.perf_counter()`` when the request arrived (its timeout counts from there).
    """

    def __init__(self, plane: DataPlane, model: ServedModel, started: float) -> None:
        self.plane, self.model, self.started = plane, model, started
        self.items: list[Item] = []
        self._answering_since: float | None = None

    def seconds_left(self) -> float:
        """Seconds of ``serve.request_timeout_seconds`` left to this request."""
        return self.plane.cfg.request_timeout_seconds - (time.perf_counter() - self.started)

    async def validate(self, parse: Callable[..., T], *args: Any, inline: bool = False) -> T:
        """``parse(model, cfg, *args)`` (a function of :mod:`._requests`), timed as preprocess.

        On a parser thread, unless ``inline``: a body small enough to parse on the event loop
        (:data:`~gpufeed.server._offload.INLINE_PARSE_BYTES`), where the hop to a thread and back
        would cost more than the parse.
        """
        run = _call_now if inline else self.plane.pool.run
        return await self.prepare(run(parse, self.model, self.plane.cfg, *args))

    async def prepare(self, work: Awaitable[T]) -> T:
        """Await ``work``, a parser of :mod:`._requests` that says itself where its steps run, timed as preprocess."""
        t0 = time.perf_counter()
        result = await work
        self.plane.metrics.observe_stage(self.model.name, "preprocess", time.perf_counter() - t0)
        return result

    async def infer(self, items: list[Item], requested: Sequence[RequestedOutput] | None = None) -> Outputs:
        """Queue validated items on the model's batcher, wait for their logits and return the head's output tensors.

        Args:
            items: The request's validated rows.
            requested: The outputs a KServe request names (``None``: all, as REST).

        Returns:
            The model's output tensors by name, one row per item (each made when first read;
            ``outputs.logits`` is the graph's output).

        Raises:
            RequestError: ``queue_full`` (503 + Retry-After), ``timeout`` (504, after
                ``serve.request_timeout_seconds`` from :attr:`started`), or ``malformed_request``
                (the classification extension asked of a model whose outputs are not class scores).
            NotReadyError: The batcher is closed (the server is stopping).
        """
        model, cfg = self.model, self.plane.cfg
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
            rows = await asyncio.wait_for(asyncio.gather(*waiters), max(self.seconds_left(), 0.001))
        except asyncio.TimeoutError:
            model.batcher.cancel(futures)
            raise RequestError(
                "timeout", f"no answer within {cfg.request_timeout_seconds:g} s (serve.request_timeout_seconds)"
            ) from None
        except asyncio.CancelledError:  # the server is stopping the task (or a gRPC client left): free the slots
            model.batcher.cancel(futures)
            raise
        logits = np.stack(rows)
        self.items, self._answering_since = items, time.perf_counter()
        head = model.head
        if not head.classifies and any(out.classification for out in requested or ()):
            raise RequestError(
                "malformed_request", f"a {head.kind} model answers maps: it has no classification output"
            )
        return head.output_tensors(logits)

    def infer_rows(self, items: list[Item], stop: threading.Event | None = None) -> np.ndarray:
        """From a worker thread (a video's windows): queue ``items``, block until their logits ``(N, C)``.

        A full queue is waited on for up to :data:`QUEUE_WAIT_S` (a video's windows arrive batch
        after batch; a moment's burst from other clients should not fail it), then refused as
        :meth:`infer` refuses; past the request's time the items leave the queue and it is 504.

        Raises:
            RequestError: ``queue_full``, ``timeout``, or an item's own error; ``NotReadyError``
                while the server stops; :class:`concurrent.futures.CancelledError` when ``stop`` is set.
        """
        model, cfg = self.model, self.plane.cfg
        waited = 0.0
        while True:
            try:
                futures = model.batcher.submit(items)
                break
            except QueueFullError as err:
                if waited >= QUEUE_WAIT_S or self.seconds_left() <= 0 or (stop is not None and stop.is_set()):
                    raise RequestError(
                        "queue_full",
                        f"model {model.name!r} is at capacity ({err.depth} of {err.capacity} images queued); retry later",
                        headers={"Retry-After": str(cfg.retry_after_seconds)},
                    ) from None
                time.sleep(0.01)
                waited += 0.01
            except BatcherClosedError as err:
                raise NotReadyError(str(err)) from None
        pending = set(futures)
        while pending:
            left = self.seconds_left()
            if left <= 0 or (stop is not None and stop.is_set()):
                model.batcher.cancel(futures)
                self.raise_if_given_up(stop)
            _, pending = concurrent.futures.wait(pending, timeout=min(left, 0.1))
        return np.stack([f.result() for f in futures])

    def raise_if_given_up(self, stop: threading.Event | None) -> None:
        """Between a video's batches: stop when its client left (``stop``) or its time is up.

        Raises:
            concurrent.futures.CancelledError: ``stop`` is set.
            RequestError: ``timeout``, past ``serve.request_timeout_seconds``.
        """
        if stop is not None and stop.is_set():
            raise concurrent.futures.CancelledError("the request was given up")
        if self.seconds_left() <= 0:
            raise RequestError(
                "timeout",
                f"no answer within {self.plane.cfg.request_timeout_seconds:g} s (serve.request_timeout_seconds)",
            )

    def rows_answered(self, items: list[Item]) -> None:
        """The rows whose times this request's answer reports (a video's windows), now that they are all scored."""
        self.items, self._answering_since = items, time.perf_counter()

    def _answered(self) -> None:
        if self._answering_since is not None:
            seconds = time.perf_counter() - self._answering_since
            self.plane.metrics.observe_answer(self.model.name, self.items, seconds)


class DataPlane:
    """What both front ends ask of the server: inference, readiness, metadata, configuration, statistics.

    Args:
        state: The served models and their life cycle.
        pool: The parser threads (and worker process) that validate requests off the event loop.
    """

    def __init__(self, state: ServingState, pool: ParsePool) -> None:
        self.state, self.pool = state, pool
        self.cfg, self.metrics = state.cfg, state.metrics
        self._videos: concurrent.futures.ThreadPoolExecutor | None = None
        self._videos_lock = threading.Lock()

    def video_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that decode and score served videos (``serve.video_streams``), made on first use."""
        with self._videos_lock:
            if self._videos is None:
                self._videos = concurrent.futures.ThreadPoolExecutor(
                    self.cfg.video_streams, thread_name_prefix="gpufeed-video"
                )
            return self._videos

    def close(self) -> None:
        """Stop the video threads (their videos have been answered: the drain waited for them)."""
        with self._videos_lock:
            if self._videos is not None:
                self._videos.shutdown(wait=True, cancel_futures=True)
                self._videos = None

    # -- inference ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def inference(self, name: str, version: str = "1", started: float | None = None) -> AsyncIterator[Inference]:
        """One inference request: in flight while the block runs, answered when it ends without error.

        Args:
            name: The model the request names.
            version: The version it names (``"1"``, or ``""`` for the latest; others are 404).
            started: When the request arrived (default: now).

        Raises:
            RequestError: ``unknown_model`` (404), or :class:`NotReadyError` (503) while the model
                loads or the server drains.
        """
        started = time.perf_counter() if started is None else started
        self.metrics.inflight.inc()
        self.state.inflight += 1  # the drain waits for these, whichever front took them
        try:
            call = Inference(self, self.state.model(name), started)
            _only_version_1(call.model.name, version)
            yield call
            call._answered()
        finally:
            self.metrics.inflight.dec()
            self.state.inflight -= 1

    # -- readiness and documents -------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every model loaded and warmed up, and the server not draining."""
        return self.state.ready

    def lookup(self, name: str, version: str = "1") -> str:
        """The served model ``name`` (loaded or not), version 1 only; 404 ``unknown_model`` otherwise."""
        if name not in self.state.entries:
            raise RequestError("unknown_model", f"model {shown(name, 100)} is not served here")
        _only_version_1(name, version)
        return name

    def model_ready(self, name: str, version: str = "1") -> bool:
        return self.state.model_ready(self.lookup(name, version))

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "gpufeed", "version": __version__, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str = "1") -> dict[str, Any]:
        """KServe model metadata: the inputs a request may send, the outputs, and the model's facts."""
        card = self.state.entries[self.lookup(name, version)].card
        spec = card.spec
        facts = {
            "task": spec.task,
            "architecture": spec.name,
            "batch_size": card.batch_size,
            "precision": card.precision,
            **input_facts(spec),
            "labels": list(card.labels),
            # A request sends exactly one of the inputs (the encoded image or video, or the decoded pixels).
            "inputs_per_request": 1,
        }
        if spec.head.accepts_video:
            facts.update(video_facts(card, self.cfg))
        return {
            "name": name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": kserve_inputs(card),
            "outputs": [tensor.kserve() for tensor in served_outputs(spec.head)],
            "parameters": facts,
        }

    def model_config(self, name: str, version: str = "1") -> dict[str, Any]:
        """Triton's model configuration (JSON form)."""
        return model_config_of(self.state, self.lookup(name, version))

    def statistics(self, name: str | None = None, version: str = "1") -> dict[str, Any]:
        """Triton's inference statistics of one model, or of every served one (``name`` ``None``)."""
        names = [self.lookup(name, version)] if name is not None else list(self.state.entries)
        return self.metrics.stats.response(names)

    def repository_index(self, ready_only: bool) -> list[dict[str, str]]:
        return repository_index(self.state, ready_only)
