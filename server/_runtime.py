"""onnxruntime for one exported model: the session, the input buffer, and a batch in -> logits out.

On a GPU the CUDA provider (or TensorRT by option) runs the graph with IOBinding: the decoded uint8
batch stays a CUDA tensor from DALI to the model, bound by pointer, no host round trip; only the
small logits come back to the host. The batch is written on torch's current stream and read by
onnxruntime on its own, so that stream is synchronised before the run, and onnxruntime's outputs
before torch reads them. On the CPU, plain numpy arrays go through ``session.run``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from gpufeed.models import ONNX_FILE, ModelCard

__all__ = ["OnnxRunner", "RuntimeSetupError"]

log = logging.getLogger("gpufeed.server")


class RuntimeSetupError(RuntimeError):
    """The requested execution provider is not usable (the message says which and why)."""


def _providers(requested: str, device, precision: str, trt_cache: Path | None) -> list:
    cuda = ("CUDAExecutionProvider", {"device_id": device.device_id or 0})
    if requested == "cpu" or (requested == "auto" and not device.is_gpu):
        return ["CPUExecutionProvider"]
    if not device.is_gpu:
        raise RuntimeSetupError(
            f"serve.execution_provider {requested!r} needs a GPU, but the device is {device.describe()}"
        )
    if requested == "tensorrt":
        options = {"device_id": device.device_id or 0, "trt_fp16_enable": precision == "fp16"}
        if trt_cache is not None:
            trt_cache.mkdir(parents=True, exist_ok=True)
            options.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(trt_cache))
        return [("TensorrtExecutionProvider", options), cuda, "CPUExecutionProvider"]
    return [cuda, "CPUExecutionProvider"]


class OnnxRunner:
    """An onnxruntime session for a model folder, fed fixed-size uint8 batches.

    Args:
        model_dir: The folder holding ``model.onnx``.
        card: Its :class:`~gpufeed.models.ModelCard`.
        device: :class:`~gpufeed.device.DeviceChoice`; on a GPU the CUDA provider is used.
        provider: ``auto``, ``cpu``, ``cuda`` or ``tensorrt`` (``serve.execution_provider``).
        threads: onnxruntime intra-op threads; 0 keeps onnxruntime's default.
        tensorrt_cache_dir: Engine cache for the TensorRT provider (``None``: no cache).

    Attributes:
        on_gpu: True when batches are CUDA tensors bound with IOBinding.
        providers: The providers the session actually uses, best first.
    """

    def __init__(
        self,
        model_dir: str | Path,
        card: ModelCard,
        device,
        provider: str = "auto",
        threads: int = 0,
        tensorrt_cache_dir: Path | None = None,
    ) -> None:
        import onnxruntime as ort

        self.card = card
        self.device = device
        wanted = _providers(provider, device, card.precision, tensorrt_cache_dir)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        # onnxruntime's pool spins after each run by default: on a busy CPU that steals the cores the
        # decoder and the HTTP loop need between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(Path(model_dir) / ONNX_FILE), options, providers=wanted)
        self.providers = self.session.get_providers()
        first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
        if first != "CPUExecutionProvider" and self.providers[0] != first:
            raise RuntimeSetupError(
                f"onnxruntime could not start {first} for {model_dir} (it offers {', '.join(self.providers)}); "
                "check the CUDA/cuDNN/TensorRT libraries, or set serve.execution_provider: cpu"
            )
        self.on_gpu = self.providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if [i.name for i in inputs] != [card.input_name] or list(inputs[0].shape) != list(card.input_shape):
            raise RuntimeSetupError(
                f"{model_dir / ONNX_FILE} takes {[(i.name, i.shape) for i in inputs]}, but its model card says "
                f"{card.input_name} {list(card.input_shape)}: re-export the model"
            )
        if inputs[0].type != "tensor(uint8)":
            raise RuntimeSetupError(f"{model_dir / ONNX_FILE} takes {inputs[0].type}; gpufeed models take uint8")
        self.output_name = outputs[0].name
        self.num_classes = card.spec.num_classes
        self._local = threading.local()  # one IOBinding and output buffer per calling thread
        log.info("model %s: onnxruntime providers %s", card.name, ", ".join(self.providers))

    def new_batch(self):
        """A zeroed input batch ``(N, ...)`` uint8 where :meth:`run` expects it (CUDA or host)."""
        shape = self.card.input_shape
        if self.on_gpu:
            import torch

            return torch.zeros(shape, dtype=torch.uint8, device=self.device.torch_device)
        return np.zeros(shape, dtype=np.uint8)

    def run(self, batch) -> np.ndarray:
        """Logits ``(N, num_classes)`` float32 on the host for a full batch from :meth:`new_batch`.

        Thread-safe: onnxruntime sessions run concurrently; each thread binds its own buffers.
        """
        if not self.on_gpu:
            return self.session.run([self.output_name], {self.card.input_name: batch})[0]
        import torch

        # The batch was written on torch's current stream (DALI copy, row copies); onnxruntime
        # computes on its own stream, so the writes must be complete before it reads.
        torch.cuda.current_stream(batch.device).synchronize()
        if not hasattr(self._local, "binding"):
            self._local.binding = self.session.io_binding()
            self._local.output = torch.empty(
                (self.card.batch_size, self.num_classes), dtype=torch.float32, device=batch.device
            )
        binding, output = self._local.binding, self._local.output
        device_id = self.device.device_id or 0
        binding.bind_input(self.card.input_name, "cuda", device_id, np.uint8, tuple(batch.shape), batch.data_ptr())
        binding.bind_output(self.output_name, "cuda", device_id, np.float32, tuple(output.shape), output.data_ptr())
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        torch.cuda.current_stream(batch.device).synchronize()
        return output.cpu().numpy()
