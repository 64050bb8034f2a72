"""``gpufeed doctor``: what works on the GPU path, what falls back to the CPU, and why.

The question every DALI or onnxruntime issue thread starts with, answered by trying: the driver
and its CUDA version, each package's CUDA build and whether they agree, whether the libraries the
GPU code loads are installed, and whether torch on CUDA, DALI's GPU operators, nvJPEG, the hardware
JPEG decoder, NVDEC (h264, hevc, av1, vp9) and onnxruntime's CUDA provider really work, each on tiny
media made in memory. See :func:`run_doctor` and docs/gpu.md ("When the GPU path misbehaves").
"""

from gpufeed.doctor._report import STATUSES, DoctorReport, ProbeResult
from gpufeed.doctor._run import DEFAULT_TIMEOUT_S, run_doctor

__all__ = ["DEFAULT_TIMEOUT_S", "STATUSES", "DoctorReport", "ProbeResult", "run_doctor"]
