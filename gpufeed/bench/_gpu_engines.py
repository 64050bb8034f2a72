"""How busy the GPU's engines were while a benchmark ran: its kernels, NVDEC and the hardware JPEG decoder.

A loader that cannot keep up is either short of decoder (the JPEG engines or NVDEC near 100 %) or
held up elsewhere (the engines idle while the CPU works). NVML, the driver's own library, answers
that without a profiler: :class:`EngineSampler` reads each engine's utilisation every
``period_s`` on a thread of its own while a block runs, through ``ctypes`` (no Python binding to
install). ``nvidia-smi dmon -s u`` prints the same counters. Where NVML cannot be loaded (a CPU
machine) or a counter is not there (an older driver, a GPU without the engine), the summary says
so instead of a figure.
"""

from __future__ import annotations

import ctypes
import threading
import time
from types import TracebackType

__all__ = ["ENGINES", "EngineSampler", "nvml_uuids"]

# engine name -> NVML query; each takes (device, unsigned *utilization, unsigned *sampling period in us)
ENGINES = {"nvdec": "nvmlDeviceGetDecoderUtilization", "jpeg": "nvmlDeviceGetJpgUtilization"}


class _Rates(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]  # nvmlUtilization_t, in percent


def nvml_uuids(cuda_index: int) -> tuple[str, ...]:
    """The names NVML may know CUDA device ``cuda_index`` by: its UUID with NVML's prefix, ``GPU-`` (or
    ``MIG-`` for a MIG slice). NVML numbers GPUs in its own (PCI) order and ignores
    ``CUDA_VISIBLE_DEVICES``, so a CUDA index is no NVML index; the UUID names one GPU for both. torch
    gives it without the prefix."""
    import torch

    uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
    return f"GPU-{uuid}", f"MIG-{uuid}"


class EngineSampler:
    """Mean utilisation (percent) of the GPU, NVDEC and JPEG engines while the block runs.

    ``kernels`` is NVML's GPU utilisation: the share of time some kernel ran, not how many SMs it
    kept busy (one small kernel running all the time reads 100).

    Each read is NVML's figure over its own last sample period (1/6 s to 1 s by product; the NVDEC and
    JPEG queries return it), so a read taken sooner than one period after the block began mostly
    covers the time before it: only later reads count (the GPU figure, whose query returns no
    period, takes the engines'). A block shorter than a period has no figure, and says so.

    Args:
        uuids: The GPU's NVML names (:func:`nvml_uuids`), tried in turn; ``None`` off a GPU.
        period_s: Seconds between reads.
        library: The NVML library to load.

    Example::

        with EngineSampler(nvml_uuids(0)) as engines:
            run_the_loader()
        engines.summary()  # {"kernels": 41.0, "nvdec": 0.0, "jpeg": 97.5} or {"unavailable": "why"}
    """

    def __init__(
        self, uuids: tuple[str, ...] | None, period_s: float = 0.1, library: str = "libnvidia-ml.so.1"
    ) -> None:
        self.period_s = period_s
        self.samples: dict[str, list[int]] = {"kernels": [], **{name: [] for name in ENGINES}}
        self.read_at_s: dict[str, list[float]] = {name: [] for name in self.samples}  # after the block began
        self.window_s = 0.0  # NVML's sample period, the longest its queries reported
        self._started = 0.0
        self.missing: dict[str, str] = {}
        self.why_not = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lib, self._handle = None, ctypes.c_void_p()
        if not uuids:
            self.why_not = "no GPU"
            return
        try:
            lib = ctypes.CDLL(library)
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            code = -1
            for uuid in uuids:
                code = lib.nvmlDeviceGetHandleByUUID(uuid.encode("ascii"), ctypes.byref(self._handle))
                if code == 0:
                    break
            if code != 0:
                lib.nvmlShutdown()
                raise OSError(f"no GPU {uuids[0]} (NVML error {code})")
        except (OSError, AttributeError) as err:
            self.why_not = f"NVML is not usable here: {err}"
            return
        self._lib = lib

    def __enter__(self) -> EngineSampler:
        self._started = time.monotonic()
        if self._lib is not None:
            self._thread = threading.Thread(target=self._run, name="gpufeed-engine-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lib is not None:
            self._lib.nvmlShutdown()
            self._lib = None

    def _run(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self.period_s):
                return

    def _read(self) -> None:
        lib, handle = self._lib, self._handle
        assert lib is not None  # the thread runs only while NVML is loaded
        rates = _Rates()
        at = time.monotonic() - self._started
        if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0:
            self._keep("kernels", rates.gpu, at)
        for name, query in ENGINES.items():
            if name in self.missing:
                continue
            value, period = ctypes.c_uint(), ctypes.c_uint()
            try:
                code = getattr(lib, query)(handle, ctypes.byref(value), ctypes.byref(period))
            except AttributeError:  # a driver older than the query
                self.missing[name] = f"this driver's NVML has no {query}"
                continue
            if code == 0:
                self._keep(name, value.value, at)
                self.window_s = max(self.window_s, period.value / 1e6)
            else:
                self.missing[name] = f"{query} answered NVML error {code} (no such engine?)"

    def _keep(self, name: str, value: int, at: float) -> None:
        self.samples[name].append(value)
        self.read_at_s[name].append(at)

    def summary(self) -> dict[str, float | str]:
        """Per engine the mean of its reads that cover the block, or why there is none (``unavailable``
        when NVML is not); ``window_s``: NVML's sample period."""
        if self.why_not:
            return {"unavailable": self.why_not}
        out: dict[str, float | str] = {"window_s": self.window_s}
        for name, values in self.samples.items():
            inside = [v for v, at in zip(values, self.read_at_s[name], strict=True) if at >= self.window_s]
            if inside:
                out[name] = sum(inside) / len(inside)
            elif values:
                last = self.read_at_s[name][-1]
                out[name] = f"the block ({last:.2f} s read) was shorter than NVML's {self.window_s:.2f} s window"
            else:
                out[name] = self.missing.get(name, "no reads")
        return out
