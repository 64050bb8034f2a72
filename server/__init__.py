"""gpufeed.server: serve exported models over HTTP with DALI decoding and dynamic batching.

``start_server(repo=...)`` (or ``gpufeed serve --model-repo DIR``) serves every model folder
written by ``gpufeed export``: KServe v2 under ``/v2`` (tritonclient works unmodified), a simple
REST ``POST /v1/models/{name}/predict``, and Prometheus ``/metrics``. Requests are validated
before batching; the :class:`Batcher` fills fixed-size batches; DALI decodes them (nvJPEG on a
GPU); onnxruntime runs them (CUDA with IOBinding on a GPU). ``GET /openapi.json`` describes the
API (:func:`openapi_document`); an optional bearer token guards everything but the health probes
(:func:`load_token`); SIGTERM drains and exits 0 (:class:`DrainingServer`).
"""

from gpufeed.server._access import TOKEN_ENV, TokenError, load_token
from gpufeed.server._batcher import Batcher, BatcherClosedError, QueueFullError
from gpufeed.server._demo import run_serve_demo, untrained_checkpoint
from gpufeed.server._errors import REASONS, RequestError
from gpufeed.server._kserve import InferRequest, encode_response, parse_request
from gpufeed.server._launch import DrainingServer, RunningServer, ServerStartError, serve_forever, start_server
from gpufeed.server._metrics import PROTOCOLS, STAGES, ServerMetrics
from gpufeed.server._model import Item, ServedModel, scores_from_logits
from gpufeed.server._openapi import openapi_document
from gpufeed.server._preprocess import ImageDecoder, ImageInfo, inspect_image
from gpufeed.server._repo import ModelEntry, ModelRepoError, load_repository
from gpufeed.server._report import histogram_quantile, stage_latency_rows, stage_latency_table
from gpufeed.server._runtime import OnnxRunner, RuntimeSetupError

__all__ = [
    "PROTOCOLS",
    "REASONS",
    "STAGES",
    "TOKEN_ENV",
    "Batcher",
    "BatcherClosedError",
    "DrainingServer",
    "ImageDecoder",
    "ImageInfo",
    "InferRequest",
    "Item",
    "ModelEntry",
    "ModelRepoError",
    "OnnxRunner",
    "QueueFullError",
    "RequestError",
    "RunningServer",
    "RuntimeSetupError",
    "ServedModel",
    "ServerMetrics",
    "ServerStartError",
    "TokenError",
    "encode_response",
    "histogram_quantile",
    "inspect_image",
    "load_repository",
    "load_token",
    "openapi_document",
    "parse_request",
    "run_serve_demo",
    "scores_from_logits",
    "serve_forever",
    "stage_latency_rows",
    "stage_latency_table",
    "start_server",
    "untrained_checkpoint",
]
