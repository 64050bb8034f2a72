"""onnxruntime for one exported model: a session per batch size, the input buffer, a batch in -> logits out.

A model card lists the batch sizes its graph runs at (``card.batch_sizes``). For a graph exported
at several sizes the batch dimension is symbolic, and each size gets its own onnxruntime session
with that dimension fixed (``add_free_dimension_override_by_name``): every session plans memory
and kernels for static shapes, as TensorRT engines and CUDA graphs want, and a batch of k rows
runs on the smallest size that holds it (:meth:`OnnxRunner.bucket_for`), padded only up to that
size. A graph exported at one size N has its batch dimension fixed at N and one session.

One input buffer of the largest size serves every session: a batch of n is its first n rows, a
contiguous view, so no copy is made to change sizes.

On a GPU the CUDA provider (or TensorRT by option) runs the graph with IOBinding: the decoded uint8
batch stays a CUDA tensor from DALI to the model, bound by pointer, no host round trip; only the
small logits come back to the host. The batch is written on torch's current stream and read by
onnxruntime on its own, so that stream is synchronised before the run, and onnxruntime's outputs
before torch reads them. On the CPU, plain numpy arrays go through ``session.run``.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import threading
from pathlib import Path

import numpy as np

from gpufeed.models import BATCH_DIM, ONNX_FILE, ModelCard
from gpufeed.server._threads import RunningCount

__all__ = ["OnnxRunner", "RuntimeSetupError", "served_batch_sizes"]

log = logging.getLogger("gpufeed.server")


class RuntimeSetupError(RuntimeError):
    """The requested execution provider is not usable (the message says which and why)."""


def served_batch_sizes(card: ModelCard, wanted: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The batch sizes to run ``card``'s model at: ``wanted`` (``serve.batch_sizes``) among the card's.

    Empty ``wanted`` means every size of the card. The card's largest size is always kept, so a
    full batch always fits; sizes the card does not list are ignored (a repository may hold models
    exported with different sizes).
    """
    if not wanted:
        return card.batch_sizes
    return tuple(n for n in card.batch_sizes if n in set(wanted) or n == card.batch_size)


def execution_providers(requested: str, device, precision: str, trt_cache: Path | None, tf32: bool = False) -> list:
    # TF32 off unless asked: export's parity check runs without it, so served logits match its figure.
    cuda = ("CUDAExecutionProvider", {"device_id": device.device_id or 0, "use_tf32": int(tf32)})
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


@functools.cache
def preload_cuda_libraries() -> None:
    """onnxruntime's ``preload_dlls()`` (1.21+): load the CUDA and cuDNN libraries of the nvidia-*
    wheels before the first CUDA session, so the provider finds them without LD_LIBRARY_PATH."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as err:  # a missing wheel is reported by the session itself, with more to say
            log.warning("onnxruntime.preload_dlls() failed: %s", err)


def _with_cache_folder(providers: list, size: int) -> list:
    """TensorRT's engine cache in a sub-folder per batch size: each size builds its own engine."""
    out = []
    for provider in providers:
        if (
            isinstance(provider, tuple)
            and provider[0] == "TensorrtExecutionProvider"
            and "trt_engine_cache_path" in provider[1]
        ):
            folder = Path(provider[1]["trt_engine_cache_path"]) / f"batch{size}"
            folder.mkdir(parents=True, exist_ok=True)
            provider = (provider[0], {**provider[1], "trt_engine_cache_path": str(folder)})
        out.append(provider)
    return out


class OnnxRunner:
    """onnxruntime sessions for a model folder, one per batch size, fed uint8 batches of those sizes.

    Args:
        model_dir: The folder holding ``model.onnx``.
        card: Its :class:`~gpufeed.models.ModelCard`.
        device: :class:`~gpufeed.device.DeviceChoice`; on a GPU the CUDA provider is used.
        provider: ``auto``, ``cpu``, ``cuda`` or ``tensorrt`` (``serve.execution_provider``).
        threads: onnxruntime intra-op threads of a batch that runs beside others (the shared budget
            of one lane); 0 keeps onnxruntime's default.
        threads_alone: Intra-op threads of a batch that starts while no other batch of the server
            is in inference (see :meth:`run`); 0 or not above ``threads``: no second set of sessions.
        tensorrt_cache_dir: Engine cache for the TensorRT provider (``None``: no cache).
        batch_sizes: The sizes to load, a subset of the card's that holds its largest (see
            :func:`served_batch_sizes`); default: every size of the card.
        inferences: The server's batches in inference, over every runner (its
            :class:`~gpufeed.server._threads.ThreadBudget`'s); default: a count of this runner's own.

    Attributes:
        batch_sizes: The sizes this runner runs, ascending; the last is the card's largest.
        on_gpu: True when batches are CUDA tensors bound with IOBinding.
        providers: The providers the sessions actually use, best first.
        threads: ``{"alone": n, "shared": m}``: the intra-op threads each kind of batch gets (0:
            onnxruntime's default).
    """

    def __init__(
        self,
        model_dir: str | Path,
        card: ModelCard,
        device,
        provider: str = "auto",
        threads: int = 0,
        tensorrt_cache_dir: Path | None = None,
        batch_sizes: tuple[int, ...] | None = None,
        tf32: bool = False,
        threads_alone: int = 0,
        inferences: RunningCount | None = None,
    ) -> None:
        self.card = card
        self.inferences = inferences or RunningCount()  # the load that picks a session
        self.device = device
        self.path = Path(model_dir) / ONNX_FILE
        sizes = tuple(batch_sizes or card.batch_sizes)
        if not set(sizes) <= set(card.batch_sizes) or sizes[-1] != card.batch_size:
            raise RuntimeSetupError(
                f"batch sizes {list(sizes)} are not a subset of {self.path}'s {list(card.batch_sizes)} ending with "
                f"its largest, {card.batch_size}"
            )
        self.batch_sizes = sizes
        wanted = execution_providers(provider, device, card.precision, tensorrt_cache_dir, tf32)
        self.sessions = {n: self._session(n, wanted, threads) for n in sizes}
        self.providers = self.sessions[sizes[-1]].get_providers()
        self.on_gpu = self.providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        # A lone batch may use every core, while batches side by side each keep to their share: an
        # onnxruntime session's pool size is fixed when it is made, so the lone case gets sessions
        # of its own (on a GPU the threads only launch kernels; one set of sessions is enough).
        alone = threads_alone > threads > 0 and not self.on_gpu
        self.sessions_alone = {n: self._session(n, wanted, threads_alone) for n in sizes} if alone else {}
        self.threads = {"alone": threads_alone if alone else threads, "shared": threads}
        self.output_name = self.sessions[sizes[-1]].get_outputs()[0].name
        self._local = threading.local()  # per calling thread: {size: (IOBinding, output buffer)}
        log.info(
            "model %s: onnxruntime providers %s, batch sizes %s, intra-op threads %s alone / %s beside others",
            card.name,
            ", ".join(self.providers),
            ", ".join(map(str, sizes)),
            self.threads["alone"] or "default",
            self.threads["shared"] or "default",
        )

    def _session(self, size: int, wanted: list, threads: int):
        import onnxruntime as ort

        card = self.card
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        # onnxruntime's pool spins after each run by default: on a busy CPU that steals the cores the
        # decoder and the HTTP loop need between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if len(card.batch_sizes) > 1:  # a symbolic batch dimension: this session fixes it
            options.add_free_dimension_override_by_name(BATCH_DIM, size)
            wanted = _with_cache_folder(wanted, size)
        if wanted[0] != "CPUExecutionProvider":  # a CUDA or TensorRT (name, options) pair
            preload_cuda_libraries()
        session = ort.InferenceSession(str(self.path), options, providers=wanted)
        first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
        if first != "CPUExecutionProvider" and session.get_providers()[0] != first:
            raise RuntimeSetupError(
                f"onnxruntime could not start {first} for {self.path} (it offers "
                f"{', '.join(session.get_providers())}); check the CUDA/cuDNN/TensorRT libraries, or set "
                "serve.execution_provider: cpu"
            )
        inputs = session.get_inputs()
        expected = [size, *card.sample_shape]
        if [i.name for i in inputs] != [card.input_name] or list(inputs[0].shape) != expected:
            raise RuntimeSetupError(
                f"{self.path} takes {[(i.name, i.shape) for i in inputs]} at batch size {size}, but its model card "
                f"says {card.input_name} {expected} (batch sizes {list(card.batch_sizes)}): re-export the model"
            )
        if inputs[0].type != "tensor(uint8)":
            raise RuntimeSetupError(f"{self.path} takes {inputs[0].type}; gpufeed models take uint8")
        return session

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def bucket_for(self, rows: int) -> int:
        """The smallest batch size that holds ``rows`` rows.

        Raises:
            ValueError: ``rows`` is not in ``1..max_batch_size``.
        """
        if not 1 <= rows <= self.max_batch_size:
            raise ValueError(f"{rows} rows: a batch holds 1 to {self.max_batch_size}")
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, rows)]

    def new_batch(self):
        """A zeroed input batch at the largest size, where :meth:`run` expects it (CUDA or host).

        A batch of n for :meth:`run` is its first n rows (``batch[:n]``).
        """
        shape = self.card.spec.input_shape(self.max_batch_size)
        if self.on_gpu:
            import torch

            return torch.zeros(shape, dtype=torch.uint8, device=self.device.torch_device)
        return np.zeros(shape, dtype=np.uint8)

    def run(self, batch) -> np.ndarray:
        """The graph's float32 output on the host for a batch of n rows, n one of ``batch_sizes``:
        ``card.spec.output_shape(n)``, ``(n, C)`` logits or ``(n, C, H, W)`` maps of a dense model.

        ``batch`` is a contiguous uint8 array (CUDA tensor on a GPU), e.g. the first n rows of
        :meth:`new_batch`. Thread-safe: onnxruntime sessions run concurrently; each thread binds
        its own buffers.
        """
        size = int(batch.shape[0])
        session = self.sessions.get(size)
        if session is None:
            raise ValueError(f"a batch of {size} rows: this model runs batches of {list(self.batch_sizes)}")
        if not self.on_gpu:
            return self._run_on_host(size, batch)
        import torch

        # The batch was written on torch's current stream (DALI copy, row copies); onnxruntime
        # computes on its own stream, so the writes must be complete before it reads.
        torch.cuda.current_stream(batch.device).synchronize()
        bound = getattr(self._local, "bound", None)
        if bound is None:
            bound = self._local.bound = {}
        if size not in bound:
            bound[size] = (session.io_binding(), self.output_buffer(size, batch.device))
        binding, output = bound[size]
        self.run_bound(session, binding, batch, output, "cuda", self.device.device_id or 0)
        torch.cuda.current_stream(batch.device).synchronize()
        return output.cpu().numpy()

    def output_buffer(self, size: int, device):
        """An empty float32 torch tensor of the graph's output shape for a batch of ``size``, on ``device``."""
        import torch

        return torch.empty(self.card.spec.output_shape(size), dtype=torch.float32, device=device)

    def run_bound(self, session, binding, batch, output, device_type: str, device_id: int) -> None:
        """Runs ``session`` from ``batch`` into ``output`` (torch tensors on ``device_type``) by I/O binding.

        The binding names the buffers' shapes; onnxruntime refuses an output whose rank or size is
        not the graph's, so ``output`` comes from :meth:`output_buffer`.
        """
        binding.bind_input(self.card.input_name, device_type, device_id, np.uint8, tuple(batch.shape), batch.data_ptr())
        binding.bind_output(
            self.output_name, device_type, device_id, np.float32, tuple(output.shape), output.data_ptr()
        )
        # No ``binding.synchronize_outputs()``: for CUDA it is a cudaDeviceSynchronize, holding
        # Python's lock, which waited for every lane's decode and run. ``Run`` already drains the
        # streams it computed on before it returns (onnxruntime's run-end ``CleanUp(true)`` flushes
        # each stream it owns: ``device_stream_collection.cc``, ``cuda_stream_handle.cc``).
        session.run_with_iobinding(binding)

    @contextlib.contextmanager
    def _host_session(self, size: int):
        """The session for a batch of ``size`` on the CPU, held while it runs: the all-cores one when no
        other batch of the server is in inference, else the shared one."""
        with self.inferences.one() as alone:
            yield self.sessions_alone.get(size, self.sessions[size]) if alone else self.sessions[size]

    def _run_on_host(self, size: int, batch: np.ndarray) -> np.ndarray:
        with self._host_session(size) as session:
            return session.run([self.output_name], {self.card.input_name: batch})[0]
