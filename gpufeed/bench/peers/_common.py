"""What both baselines share: PIL preprocessing equal in effect to gpufeed's, and the reply."""

from __future__ import annotations

import io

import numpy as np

__all__ = ["onnx_providers", "pil_preprocess", "top_k_reply"]


def pil_preprocess(data: bytes, size_px: int, crop_fraction: float) -> np.ndarray:
    """Decode with PIL, resize the shorter side to ``size / crop_fraction``, centre-crop ``size``.

    Returns:
        uint8 ``(3, size, size)`` RGB, the model's input row.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img = img.convert("RGB")
        width, height = img.size
        scale = size_px / crop_fraction / min(width, height)
        img = img.resize((max(size_px, round(width * scale)), max(size_px, round(height * scale))), Image.BILINEAR)
        left, top = (img.width - size_px) // 2, (img.height - size_px) // 2
        img = img.crop((left, top, left + size_px, top + size_px))
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
