"""gpufeed.server: serve exported models over HTTP with DALI decoding and dynamic batching.

``start_server(repo=...)`` (or ``gpufeed serve --model-repo DIR``) serves every model folder
written by ``gpufeed export``: KServe v2 under ``/v2`` with Triton's model configuration,
statistics and repository extensions (tritonclient works unmodified), a simple REST
``POST /v1/models/{name}/predict``, and Prometheus ``/metrics``; with ``grpc_port`` (``serve.grpc_port``,
``--grpc-port``) also KServe v2 over gRPC (``inference.GRPCInferenceService``, the ``grpc`` extra),
sharing everything with HTTP. Requests are validated before
batching, off the event loop; the :class:`Batcher` fills fixed-size batches; DALI decodes them
(nvJPEG on a GPU); onnxruntime runs them (CUDA with IOBinding on a GPU). ``GET /openapi.json``
describes the API (:func:`openapi_document`); an optional bearer token guards everything but the
health probes (:func:`load_token`); SIGTERM drains and exits 0 (:class:`DrainingServer`).

``__all__`` holds what users call (each name is in the API reference, ``docs/api/``); the names
gpufeed's other packages use are listed in ``_EXPORTS`` too (not in the reference; they change with
their users), so no package imports the server's private modules. The names are imported on first use (PEP 562):
importing one light part of the server (the KServe parser, which request-parsing worker
processes import) does not load torch, DALI and onnxruntime along with it.
"""

from __future__ import annotations

import importlib

# name -> the private module that defines it
_EXPORTS = {
    "TOKEN_ENV": "_access",
    "TokenError": "_access",
    "load_token": "_access",
    "Batcher": "_batcher",
    "BatcherClosedError": "_batcher",
    "QueueFullError": "_batcher",
    "REASONS": "_errors",
    "RequestError": "_errors",
    "ModelRepoError": "_repo",
    "DrainingServer": "_launch",
    "RunningServer": "_launch",
    "ServerStartError": "_launch",
    "serve_forever": "_launch",
    "start_server": "_launch",
    "PROTOCOLS": "_metrics",
    "STAGES": "_metrics",
    "openapi_document": "_openapi",
    # For gpufeed's own packages (not in the API reference):
    "ImageDecoder": "_preprocess",
    "OnnxRunner": "_runtime",
    "RuntimeSetupError": "_runtime",
    "execution_providers": "_runtime",
    "inspect_image": "_preprocess",
    "preload_cuda_libraries": "_runtime",
    "route_of": "_access",
    "stage_latency_table": "_report",
}

__all__ = [
    "PROTOCOLS",
    "REASONS",
    "STAGES",
    "TOKEN_ENV",
    "Batcher",
    "BatcherClosedError",
    "DrainingServer",
    "ModelRepoError",
    "QueueFullError",
    "RequestError",
    "RunningServer",
    "ServerStartError",
    "TokenError",
    "load_token",
    "openapi_document",
    "serve_forever",
    "start_server",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
