"""Config section for serving: the inference server's address, batching, limits and runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpufeed.core import option

__all__ = ["ServeConfig"]

ExecutionProvider = Literal["auto", "cpu", "cuda", "tensorrt"]


@dataclass(frozen=True)
class ServeConfig:
    """The inference server (``gpufeed serve``): address, batching, limits, execution provider.

    Requests are validated, then queued. A model runs at the batch sizes of its card (``gpufeed
    export --batch-sizes``, e.g. 1, 2, 4, 8), or those of them listed in ``batch_sizes``. When a
    batch can start, a queue holding exactly one of those sizes, or the largest or more, runs at
    once; any other count waits until it reaches one or its oldest image has waited
    ``max_delay_ms``. A batch of k runs at the smallest size that holds k, padded up to it.

    Access: with ``auth_token_file`` (or the ``GPUFEED_SERVE_TOKEN`` environment variable) every
    endpoint except the two health probes needs ``Authorization: Bearer <token>``. Only the file's
    path is configuration; the secret itself never enters a config that is saved with outputs.
    """

    host: str = option("127.0.0.1", doc="address to bind; loopback by default, 0.0.0.0 to expose")
    auth_token_file: Path | None = option(
        None,
        doc="file holding the bearer token that inference and admin endpoints require (401 without it); "
        "none: the GPUFEED_SERVE_TOKEN environment variable if set, else no auth",
    )
    port: int = option(8000, ge=0, le=65535, doc="TCP port; 0 picks a free one")
    grpc_port: int | None = option(
        None,
        ge=0,
        le=65535,
        doc="also serve KServe v2 over gRPC (inference.GRPCInferenceService) on this TCP port: same host, "
        "models, batchers, limits, token and metrics as HTTP; 0 or none: no gRPC (gpufeed serve --grpc-port 0 "
        "picks a free port). Needs the grpc extra: pip install 'gpufeed[grpc]'",
    )
    max_delay_ms: float = option(
        5.0, ge=0.0, le=10_000.0, doc="longest wait for the queue to reach one of the batch sizes before it runs"
    )
    batch_sizes: tuple[int, ...] = option(
        (),
        ge=1,
        doc="batch sizes to run each model at, among its card's (its largest is always kept); empty: all of "
        "them. [8] alone: every batch waits up to max_delay_ms to fill",
    )
    queue_capacity: int = option(256, ge=1, doc="images waiting per model before 503 + Retry-After")
    request_timeout_seconds: float = option(
        30.0, gt=0.0, doc="a request not answered by then gets 504; a body not fully received by then gets 408"
    )
    retry_after_seconds: int = option(1, ge=0, doc="Retry-After sent with 503 queue_full and while draining")
    shutdown_delay_seconds: float = option(
        0.0,
        ge=0.0,
        le=600.0,
        doc="after SIGTERM, keep answering (readiness 503, new requests 503) this long before closing the "
        "socket, so load balancers see the readiness change; in-flight requests finish either way",
    )
    max_body_bytes: int = option(16 * 1024 * 1024, ge=1024, doc="larger request bodies get 413")
    max_header_bytes: int = option(
        64 * 1024, ge=1024, doc="a longer request line plus headers gets 431 and the connection is closed"
    )
    header_timeout_seconds: float = option(
        10.0,
        gt=0.0,
        le=600.0,
        doc="a request line plus headers not complete this long after their first byte (or after the connection "
        "opened) gets 408 and the connection is closed",
    )
    max_image_pixels: int = option(40_000_000, ge=1, doc="width x height above this is refused (decompression bombs)")
    max_images_per_request: int = option(64, ge=1, doc="images or tensor rows in one request")
    max_json_map_pixels: int = option(
        4_194_304,
        ge=1,
        doc="a dense model's JSON answer holding more map values (width x height, summed over its images) is "
        "refused with 400 before inference; PNG answers (Accept: image/png) and ?size=model are the compact ways",
    )
    max_video_bytes: int = option(
        256 * 1024 * 1024,
        ge=1024,
        doc="a clip model's encoded video (a REST video/* body, a KServe 'video' BYTES input) larger than this gets "
        "413; a clip model's request bodies may be this large (other models: max_body_bytes)",
    )
    max_video_frames: int = option(
        18_000, ge=1, doc="a video holding more frames gets 400 (video_too_long) before any frame is decoded"
    )
    max_video_seconds: float = option(
        900.0, gt=0.0, doc="a video lasting longer (its frames' timestamps) gets 400 (video_too_long) before decoding"
    )
    video_hop_frames: int = option(
        1,
        ge=1,
        doc="frames between the starts of a served video's windows unless the request says (?hop_frames=, "
        "parameters.hop_frames); 1: a window at every frame, as gpufeed predict's default",
    )
    video_streams: int = option(
        2, ge=1, le=64, doc="videos decoded and scored at once; more wait their turn (their time counts)"
    )
    video_window_runs: bool = option(
        True,
        doc="with a window at every frame, a stacked-frame clip model on the CPU scores runs of windows that "
        "share its first convolution, as gpufeed predict does (the same probabilities within 1e-6, about 0.6 of "
        "the CPU time); false: every window through the batcher",
    )
    top_k: int = option(5, ge=1, doc="labels returned by the REST endpoint unless ?top_k= says otherwise")
    execution_provider: ExecutionProvider = option(
        "auto", doc="onnxruntime provider: auto (CUDA on a GPU, else CPU), cpu, cuda, tensorrt"
    )
    tensorrt_cache_dir: Path | None = option(None, doc="where the TensorRT provider caches engines; none: no cache")
    cuda_tf32: bool = option(
        False,
        doc="let the CUDA provider use TF32 math (faster on Ampere and later, logits drift from export's "
        "parity figure, which is measured without it); default off",
    )
    decode_threads: int = option(
        0, ge=0, doc="DALI CPU threads of each worker's decoder; 0: the cores shared out among the workers"
    )
    decode_threads_alone: int = option(
        0,
        ge=0,
        doc="DALI CPU threads of a batch that starts while no other batch of the server is decoding or in "
        "inference (a lone client): its images are cut into bands decoded side by side, where that gives the "
        "same pixels; 0: every core. Not above decode_threads: off; ignored on a GPU",
    )
    inference_threads: int = option(
        0,
        ge=0,
        doc="onnxruntime intra-op threads of a batch that runs beside another; 0: on the CPU the cores shared "
        "out among the workers, on a GPU onnxruntime's default",
    )
    inference_threads_alone: int = option(
        0,
        ge=0,
        doc="onnxruntime intra-op threads of a batch that starts while no other batch of the server is in "
        "inference (a lone client); 0: every core on the CPU. Not above inference_threads: off (one session "
        "per batch size instead of two); ignored on a GPU",
    )
    warmup_batches: int = option(
        2,
        ge=1,
        doc="full batches of every batch size run through decode and inference before ready: on every lane "
        "at once (their inferences side by side, as under load), then alone",
    )
    workers_per_model: int = option(
        0,
        ge=0,
        le=8,
        doc="batches in flight per model (a GPU decodes one while it runs another; the CPU runs two side by "
        "side, one thread each on two cores); 0: 2",
    )
