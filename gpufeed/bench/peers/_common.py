"""What both baselines share: PIL preprocessing equal in effect to gpufeed's, and the reply."""

from __future__ import annotations

import io

import numpy as np

from gpufeed.core import SizePx

__all__ = ["onnx_providers", "pil_preprocess", "top_k_reply"]


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


def onnx_providers(device: str) -> list[str]:
    """CUDA then CPU on a GPU (as gpufeed's server does), CPU only otherwise."""
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "gpu" else ["CPUExecutionProvider"]
