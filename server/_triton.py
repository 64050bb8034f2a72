"""Triton's extensions beyond the KServe v2 core, as JSON documents: model configuration and repository index.

``GET /v2/models/NAME/config`` answers the JSON form of Triton's ``ModelConfig`` message
(``model_config.proto``, field names as in the proto, 64-bit integers as JSON numbers, enums as
their names, every field present), so ``tritonclient``'s ``get_model_config`` and tools that read
it (perf_analyzer, model analyzer) see what the server really does:

* ``max_batch_size``: the largest batch the model executes (the card's largest batch size); a
  request may carry up to ``serve.max_images_per_request`` rows, which the server splits;
* ``input``: ``image`` (``TYPE_STRING``, encoded JPEG/PNG, for a model whose head accepts them),
  ``video`` (``TYPE_STRING``, one encoded video, for a clip model) and the card's UINT8 input, each
  ``optional`` when there are two (a request sends exactly one); a clip model's parameters say what
  its video input takes (``video_*``: containers, codecs, limits, the windows);
* ``output``: the head's output tensors (``logits`` and ``scores`` of a classifier, a dense
  model's maps), then those only a video request answers (a clip model's ``window_scores`` and
  ``window_starts``), as the KServe model metadata lists them;
* ``dynamic_batching``: the batch sizes the model runs at as ``preferred_batch_size``, ``serve.max_delay_ms``
  as the queue delay, ``serve.queue_capacity`` (images) and ``serve.request_timeout_seconds`` as
  the queue policy;
* ``instance_group``: ``serve.workers_per_model`` batches in flight, on the GPU or the CPU.

``POST /v2/repository/index`` lists the served models with their state (``READY``, ``LOADING``,
``UNAVAILABLE`` and why). Models are fixed when the server starts, so the repository extension's
load and unload are refused, and ``model_repository`` is not among the advertised extensions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufeed.models import OutputTensor
from gpufeed.server._video import VIDEO_INPUT, video_facts

if TYPE_CHECKING:
    from gpufeed.server._state import ServingState

__all__ = [
    "EXTENSIONS",
    "batch_sizes_of",
    "input_facts",
    "model_config",
    "model_config_of",
    "repository_index",
]

# What GET /v2 advertises; each is implemented in full.
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
ENCODED_INPUT = "image"


def served_outputs(head) -> list[OutputTensor]:
    """Every output tensor a model may answer: its head's, then those only a video request gives (clip models)."""
    outputs = list(head.outputs())
    names = {tensor.name for tensor in outputs}
    return outputs + [tensor for tensor in head.video_outputs() if tensor.name not in names]


def batch_sizes_of(card) -> tuple[int, ...]:
    """The batch sizes the model executes, ascending (the card's ``batch_sizes``, else its one ``batch_size``)."""
    sizes = getattr(card, "batch_sizes", None) or (card.batch_size,)
    return tuple(sorted({int(n) for n in sizes}))


def _input(name: str, data_type: str, dims: list[int], fmt: str, optional: bool, reshape=None) -> dict:
    entry = {
        "name": name,
        "data_type": data_type,
        "format": fmt,
        "dims": dims,
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": optional,
        "is_non_linear_format_io": False,
    }
    if reshape is not None:
        entry["reshape"] = {"shape": reshape}
    return entry


def _output(tensor: OutputTensor) -> dict:
    return {
        "name": tensor.name,
        "data_type": f"TYPE_{tensor.datatype}",
        "dims": list(tensor.shape),
        "label_filename": "",
        "is_shape_tensor": False,
        "is_non_linear_format_io": False,
    }


def _inputs(card, head) -> list[dict]:
    """The model's inputs: the encoded ones its head takes (video, image), then its pixels (optional beside them)."""
    encoded = head.accepts_encoded
    sample = [int(d) for d in card.sample_shape]
    inputs = [
        _input(card.input_name, "TYPE_UINT8", sample, "FORMAT_NCHW" if len(sample) == 3 else "FORMAT_NONE", encoded)
    ]
    if encoded:  # one encoded image per row: dims [1], which the model sees as a scalar per row
        inputs.insert(0, _input(ENCODED_INPUT, "TYPE_STRING", [1], "FORMAT_NONE", True, reshape=[]))
    if head.accepts_video:  # one encoded video per request (server/_video.py); the pixels become optional
        inputs[0]["optional"] = True
        inputs.insert(0, _input(VIDEO_INPUT, "TYPE_STRING", [1], "FORMAT_NONE", True, reshape=[]))
    return inputs


def _parameters(card, cfg) -> dict[str, dict[str, str]]:
    """The config's ``parameters``: what a client needs to know of the model and the server's limits."""
    spec = card.spec
    facts = {
        "task": spec.task,
        "architecture": spec.name,
        "precision": card.precision,
        **input_facts(spec),
        "labels": ",".join(card.labels),
        "max_images_per_request": cfg.max_images_per_request,
        "max_image_pixels": cfg.max_image_pixels,
        "warmup_batches": cfg.warmup_batches,
    }
    if spec.head.accepts_video:
        facts.update(video_facts(card, cfg))
    return {key: {"string_value": str(value)} for key, value in facts.items()}


def _optimization(cfg, on_gpu: bool) -> dict:
    accelerators = [{"name": "tensorrt", "parameters": {}}] if cfg.execution_provider == "tensorrt" else []
    return {
        "priority": "PRIORITY_DEFAULT",
        "execution_accelerators": {"gpu_execution_accelerator": accelerators, "cpu_execution_accelerator": []},
        "input_pinned_memory": {"enable": on_gpu},
        "output_pinned_memory": {"enable": on_gpu},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    }


def _dynamic_batching(sizes: tuple[int, ...], cfg) -> dict:
    return {
        "preferred_batch_size": list(sizes),
        "max_queue_delay_microseconds": round(cfg.max_delay_ms * 1000),
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": round(cfg.request_timeout_seconds * 1_000_000),
            "allow_timeout_override": False,
            "max_queue_size": cfg.queue_capacity,
        },
        "priority_queue_policy": {},
    }


def _instance_group(name: str, on_gpu: bool, device_id: int | None, workers: int) -> dict:
    return {
        "name": name,
        "kind": "KIND_GPU" if on_gpu else "KIND_CPU",
        "count": workers,
        "gpus": [device_id or 0] if on_gpu else [],
        "secondary_devices": [],
        "profile": [],
        "passive": False,
        "host_policy": "",
    }


def model_config(name: str, card, cfg, *, on_gpu: bool, device_id: int | None, workers: int, batch_sizes=None) -> dict:
    """Triton's model configuration JSON for a served model.

    Args:
        name: The served name.
        card: Its :class:`~gpufeed.models.ModelCard`.
        cfg: :class:`gpufeed.config.ServeConfig`.
        on_gpu, device_id: Where it runs.
        workers: Batches in flight (``serve.workers_per_model`` as resolved).
        batch_sizes: The sizes the loaded model runs at (the card's, possibly narrowed by
            ``serve.batch_sizes``); default: the card's.
    """
    sizes = tuple(sorted(batch_sizes)) if batch_sizes else batch_sizes_of(card)
    return {
        "name": name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": sizes[-1],
        "input": _inputs(card, card.spec.head),
        "output": [_output(tensor) for tensor in served_outputs(card.spec.head)],
        "batch_input": [],
        "batch_output": [],
        "optimization": _optimization(cfg, on_gpu),
        "dynamic_batching": _dynamic_batching(sizes, cfg),
        "instance_group": [_instance_group(name, on_gpu, device_id, workers)],
        "default_model_filename": "model.onnx",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": _parameters(card, cfg),
        "model_warmup": [],  # gpufeed warms up with its own generated batches: parameters.warmup_batches
        "model_transaction_policy": {"decoupled": False},
        "response_cache": {"enable": False},
    }


def input_facts(spec) -> dict[str, Any]:
    """What a client needs to prepare an input for a model spec: size, crop, clip length, layout, labels' kind.

    Both the KServe model metadata and Triton's model config state these, from here.
    """
    return {
        "size_px": spec.to_dict()["size_px"],
        "width_px": spec.size_px.width_px,
        "height_px": spec.size_px.height_px,
        "eval_crop_fraction": spec.eval_crop_fraction,
        "clip_length_frames": spec.clip_length_frames,
        "layout": spec.input_layout,
        "multilabel": spec.multilabel,
    }


def model_config_of(state: ServingState, name: str) -> dict[str, Any]:
    """Triton's model configuration of served model ``name`` (JSON form), loaded or not yet."""
    cfg, model = state.cfg, state.models.get(name)
    # Before the model loads: where its sessions will run (a GPU host may serve on the CPU provider).
    on_gpu = model.on_gpu if model is not None else state.device.is_gpu and cfg.execution_provider != "cpu"
    workers = model.workers if model is not None else state.budget.workers
    sizes = model.batch_sizes if model is not None else None
    card = state.entries[name].card
    return model_config(
        name, card, cfg, on_gpu=on_gpu, device_id=state.device.device_id, workers=workers, batch_sizes=sizes
    )


def repository_index(state: ServingState, ready_only: bool) -> list[dict[str, str]]:
    """Triton's ``$repository_index_response``: every served model with its state and the reason for it.

    Args:
        state: The served models (:meth:`~gpufeed.server._state.ServingState.model_state` says each one's).
        ready_only: Only the models ready for inference (the request's ``"ready": true``).
    """
    out = []
    for name in state.entries:
        model_state, reason = state.model_state(name)
        if ready_only and model_state != "READY":
            continue
        out.append({"name": name, "version": "1", "state": model_state, "reason": reason})
    return out
