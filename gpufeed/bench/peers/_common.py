"""What both baselines share: PIL preprocessing equal in effect to gpufeed's, and the reply."""

from __future__ import annotations

import contextlib
import io

import numpy as np

from gpufeed.core import SizePx

__all__ = ["onnx_providers", "onnx_session", "pil_preprocess", "top_k_reply"]


def pil_preprocess(data: bytes, size_px: SizePx, crop_fraction: float) -> np.ndarray:
    """Decode with PIL, scale until ``W x H / crop_fraction`` just fits, centre-crop ``W x H``.

    For a square size that is: resize the shorter side to ``size / crop_fraction``, centre-crop.

    Returns:
        uint8 ``(3, H, W)`` RGB, the model's input row.
    """
    from PIL import Image

    out_w, out_h = size_px
    with Image.open(io.BytesIO(data)) as source:
        img = source.convert("RGB")
    width, height = img.size
    scale = max(out_w / width, out_h / height) / crop_fraction
    size = (max(out_w, round(width * scale)), max(out_h, round(height * scale)))
    img = img.resize(size, Image.Resampling.BILINEAR)
    left, top = (img.width - out_w) // 2, (img.height - out_h) // 2
    img = img.crop((left, top, left + out_w, top + out_h))
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def top_k_reply(logits: np.ndarray, labels: tuple[str, ...], k: int = 5) -> dict:
    """Softmax top-k as JSON, the same shape of answer gpufeed's REST endpoint gives."""
    e = np.exp(logits - logits.max())
    probs = e / e.sum()
    top = np.argsort(-probs)[:k]
    return {"top_k": [{"label": labels[j], "index": int(j), "score": float(probs[j])} for j in top]}


def onnx_providers(device: str) -> list:
    """CUDA then CPU on a GPU (as gpufeed's server does), CPU only otherwise.

    TF32 off, as gpufeed's server runs by default (``serve.cuda_tf32: false``): onnxruntime's CUDA
    provider turns it on unless told (``CUDAExecutionProviderInfo::use_tf32{true}``), which would time
    the baselines' convolutions in TF32 against gpufeed's in full fp32.
    """
    if device != "gpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]


def onnx_session(path: str, device: str):
    """An onnxruntime session on ``device``; on a GPU it must have taken the CUDA provider.

    Raises:
        SystemExit: ``device`` is ``gpu`` and onnxruntime fell back to its CPU provider (it prints
            why to stdout, which the benchmark discards): a baseline on the CPU would make gpufeed
            look many times faster than it is.
    """
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)  # what gpufeed's server does before its CUDA sessions
    if device == "gpu" and preload is not None:
        with contextlib.suppress(Exception):  # a missing library shows as the session's fallback below
            preload()
    session = ort.InferenceSession(path, providers=onnx_providers(device))
    if device == "gpu" and session.get_providers()[0] != "CUDAExecutionProvider":
        raise SystemExit(f"{path}: onnxruntime did not start its CUDA provider (it offers {session.get_providers()})")
    return session
