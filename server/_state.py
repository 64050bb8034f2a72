"""The server's models and their life cycle: validate the repository, load and warm up, drain on exit.

Loading (onnxruntime sessions, DALI graphs, warm-up batches) runs on a background thread, so the
HTTP endpoint answers liveness at once and readiness only once every model has been warmed up.

Draining (:meth:`ServingState.begin_drain`, on SIGTERM): readiness turns false at once and requests
that arrive from then on get 503 ``not_ready`` with Retry-After; requests already admitted (counted
in :attr:`ServingState.inflight`) run to their answer, their batches no longer waiting to fill.
"""

from __future__ import annotations

import gc
import logging
import threading

from gpufeed.pipelines import eval_decoder_options
from gpufeed.server._errors import RequestError
from gpufeed.server._metrics import ServerMetrics
from gpufeed.server._model import ServedModel
from gpufeed.server._repo import ModelEntry
from gpufeed.server._threads import ThreadBudget

__all__ = ["ServingState"]

log = logging.getLogger("gpufeed.server")


class ServingState:
    """The models one server serves.

    Args:
        entries: From :func:`gpufeed.server._repo.load_repository`.
        cfg: :class:`gpufeed.config.ServeConfig`.
        device: :class:`gpufeed.device.DeviceChoice`.
        decoder_options: The image decoders' ``mixed`` arguments: the evaluation loader's, from
            :func:`gpufeed.pipelines._image_pipeline.eval_decoder_options` (the server passes its
            config's ``loader.hw_decoder_load``); ``None``: those of the default config.

    Attributes:
        budget: The thread budget, resolved once here and handed to every model.
    """

    def __init__(self, entries: list[ModelEntry], cfg, device, decoder_options: dict | None = None) -> None:
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        self.entries = {e.name: e for e in entries}
        self.cfg, self.device, self.decoder_options = cfg, device, decoder_options
        self.budget = ThreadBudget.resolve(cfg, device)
        self.metrics = ServerMetrics({e.name: e.card.batch_size for e in entries})
        self.models: dict[str, ServedModel] = {}
        self.load_error: BaseException | None = None
        self.loaded = threading.Event()
        self.closing = False
        self.inflight = 0  # inference requests being handled, not yet answered (event loop thread only)
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, entries: list[ModelEntry], cfg, device) -> ServingState:
        """The state a server of :class:`gpufeed.config.Config` ``cfg`` serves from.

        Its ``serve`` section, and the decoder options evaluation takes from its ``loader``
        section (:func:`~gpufeed.pipelines._image_pipeline.eval_decoder_options`), so an image
        served takes the decoder it took in evaluation.
        """
        return cls(entries, cfg.serve, device, eval_decoder_options(cfg.loader.hw_decoder_load))

    @property
    def ready(self) -> bool:
        """Every model loaded and warmed up, and not shutting down."""
        return (
            not self.closing
            and self.loaded.is_set()
            and self.load_error is None
            and len(self.models) == len(self.entries)
            and all(m.ready for m in self.models.values())
        )

    def warmed_up(self, name: str) -> bool:
        """Model ``name`` is loaded and warmed up (draining or not)."""
        model = self.models.get(name)
        return model is not None and model.ready

    def model_state(self, name: str) -> tuple[str, str]:
        """Triton's state of served model ``name`` (``READY``, ``LOADING``, ``UNAVAILABLE``) and why.

        The one readiness rule of every front: ready means warmed up and not draining.
        """
        if self.warmed_up(name) and not self.closing:
            return "READY", ""
        if self.closing:
            return "UNAVAILABLE", "the server is shutting down"
        if self.load_error is not None:
            return "UNAVAILABLE", f"loading failed: {self.load_error}"
        return "LOADING", "loading and warming up"

    def model_ready(self, name: str) -> bool:
        """Model ``name`` takes inference requests now."""
        return self.model_state(name)[0] == "READY"

    def load(self) -> None:
        """Load and warm up every model (blocking); a failure is kept in ``load_error``."""
        try:
            for name, entry in self.entries.items():
                model = ServedModel(
                    name,
                    entry.dir,
                    entry.card,
                    self.cfg,
                    self.device,
                    self.metrics,
                    self.budget,
                    self.decoder_options,
                )
                model.warm_up()
                self.models[name] = model
                log.info("model %s (%s) ready: %s", name, entry.card.spec.name, model.describe())
        except BaseException as err:
            self.load_error = err
            log.error("loading the models failed: %s", err)
        else:
            if not self.closing:
                _freeze_long_lived()
        finally:
            self.loaded.set()

    def start_loading(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.load, name="gpufeed-model-loader", daemon=True)
        self._thread.start()
        return self._thread

    def model(self, name: str) -> ServedModel:
        """The loaded, ready model called ``name``.

        Raises:
            RequestError: ``unknown_model`` (404), or 503 while it loads or the server drains.
        """
        if name not in self.entries:
            known = ", ".join(sorted(self.entries))
            raise RequestError("unknown_model", f"model {name[:100]!r} is not served here; models: {known}")
        model = self.models.get(name)
        retry = self.cfg.retry_after_seconds
        if self.closing:
            raise NotReadyError(f"the server is shutting down; model {name!r} takes no new requests", retry)
        if model is None or not model.ready:
            raise NotReadyError(f"model {name!r} is not ready yet (loading and warming up)", retry)
        return model

    def begin_drain(self) -> None:
        """Refuse new requests (503 ``not_ready``), report not ready, and stop batches waiting to fill."""
        if not self.closing:
            log.info("draining: readiness is false; %d request(s) in flight will finish", self.inflight)
        self.closing = True
        for model in list(self.models.values()):
            model.batcher.expedite()

    def close(self, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Stop taking requests; finish (``drain``) or fail queued work; release the models."""
        self.closing = True
        for model in self.models.values():
            model.close(drain=drain, timeout=timeout)
        gc.unfreeze()  # what the server held may be collected again (a process that goes on, e.g. tests)
        log.info("server stopped: %d model(s) %s", len(self.models), "drained" if drain else "closed")


def _freeze_long_lived() -> None:
    """Take what exists once the models are warm out of the cyclic collector's sight.

    torch, onnxruntime, DALI and the models leave about 200,000 tracked objects that live as long
    as the server. Every full collection walked them all: a 100-150 ms pause of every thread that
    needs the GIL, about once per 1,500 requests (measured on the 2-core CPU with ResNet-18). Frozen,
    they are skipped; objects made while serving are collected as before.
    """
    gc.collect()
    gc.freeze()


class NotReadyError(RequestError):
    """503 for a model that is loading or a server that is draining (not a client error: uncounted)."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__("internal", message, status=503, headers={"Retry-After": str(retry_after_seconds)})
        self.reason = "not_ready"
