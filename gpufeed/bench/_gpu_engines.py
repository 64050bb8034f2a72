"""How busy the GPU's engines were while a benchmark ran: SMs, NVDEC and the hardware JPEG decoder.

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
from types import TracebackType

__all__ = ["ENGINES", "EngineSampler"]

# engine name -> NVML query; each takes (device, unsigned *utilization, unsigned *sampling period in us)
ENGINES = {"nvdec": "nvmlDeviceGetDecoderUtilization", "jpeg": "nvmlDeviceGetJpgUtilization"}


class _Rates(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]  # nvmlUtilization_t, in percent


class EngineSampler:
    """Mean utilisation (percent) of the GPU's SMs, NVDEC and JPEG engines while the block runs.

    Args:
        device_index: The GPU's NVML index (CUDA's, when ``CUDA_VISIBLE_DEVICES`` does not reorder).
        period_s: Seconds between reads (NVML's own window for NVDEC and JPEG is about that long).
        library: The NVML library to load.

    Example::

        with EngineSampler(0) as engines:
            run_the_loader()
        engines.summary()  # {"sm": 41.0, "nvdec": 0.0, "jpeg": 97.5} or {"unavailable": "why"}
    """

    def __init__(self, device_index: int, period_s: float = 0.1, library: str = "libnvidia-ml.so.1") -> None:
        self.period_s = period_s
        self.samples: dict[str, list[int]] = {"sm": [], **{name: [] for name in ENGINES}}
        self.missing: dict[str, str] = {}
        self.why_not = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lib, self._handle = None, ctypes.c_void_p()
        try:
            lib = ctypes.CDLL(library)
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            code = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device_index), ctypes.byref(self._handle))
            if code != 0:
                lib.nvmlShutdown()
                raise OSError(f"no GPU {device_index} (NVML error {code})")
        except (OSError, AttributeError) as err:
            self.why_not = f"NVML is not usable here: {err}"
            return
        self._lib = lib

    def __enter__(self) -> EngineSampler:
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
        if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0:
            self.samples["sm"].append(rates.gpu)
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
                self.samples[name].append(value.value)
            else:
                self.missing[name] = f"{query} answered NVML error {code} (no such engine?)"

    def summary(self) -> dict[str, float | str]:
        """Per engine the mean of its reads, or why there is none (``unavailable`` when NVML is not)."""
        if self.why_not:
            return {"unavailable": self.why_not}
        out: dict[str, float | str] = {}
        for name, values in self.samples.items():
            if values:
                out[name] = sum(values) / len(values)
            else:
                out[name] = self.missing.get(name, "no reads")
        return out
