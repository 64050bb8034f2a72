"""Kornia augmentation on the training device, built from the ``augment`` config section.

Input and output are the loader's uint8 pixels: images ``(N, 3, H, W)`` or clips
``(N, 3, T, H, W)``, on whatever device they arrive. Inside, pixels become float32 in [0, 1] (what
Kornia expects), the ops run in the configured order, and the result is rounded back to uint8, so
the model keeps its one input contract (uint8, normalised inside) in training, export and serving
alike. A clip gets the same parameters on all of its frames (``kornia.augmentation.VideoSequential``),
so motion is not destroyed by per-frame jitter. With no ops the batch passes through untouched.
"""

from __future__ import annotations

import torch
from torch import nn

from gpufeed.config import AugmentConfig

__all__ = ["Augmenter", "build_augmenter", "build_op"]


def build_op(name: str, cfg: AugmentConfig) -> nn.Module:
    """One Kornia op from its config subsection ``cfg.<name>``."""
    import kornia.augmentation as K

    if name == "color_jitter":
        c = cfg.color_jitter
        return K.ColorJitter(c.brightness, c.contrast, c.saturation, c.hue, p=c.p)
    if name == "grayscale":
        return K.RandomGrayscale(p=cfg.grayscale.p)
    if name == "gaussian_blur":
        c = cfg.gaussian_blur
        return K.RandomGaussianBlur((c.kernel_size_px, c.kernel_size_px), c.sigma, p=c.p)
    if name == "rotation":
        return K.RandomRotation(cfg.rotation.degrees, p=cfg.rotation.p)
    if name == "erasing":
        c = cfg.erasing
        return K.RandomErasing(scale=c.scale, ratio=c.ratio, value=0.0, p=c.p)
    if name == "horizontal_flip":
        return K.RandomHorizontalFlip(p=cfg.horizontal_flip.p)
    from gpufeed.config import AUGMENT_OPS

    raise ValueError(f"augment op {name!r} is not known; known ops: {', '.join(AUGMENT_OPS)}")


class Augmenter(nn.Module):
    """uint8 in, uint8 out: the configured Kornia ops on images or clips.

    Args:
        ops: Kornia modules, applied in order.
        clips: Inputs are ``(N, 3, T, H, W)`` clips (same parameters on every frame).
    """

    def __init__(self, ops: list[nn.Module], clips: bool) -> None:
        super().__init__()
        self.clips = clips
        self.names = [type(op).__name__ for op in ops]
        if not ops:
            self.pipeline = None
        elif clips:
            import kornia.augmentation as K

            self.pipeline = K.VideoSequential(*ops, data_format="BCTHW", same_on_frame=True)
        else:
            self.pipeline = nn.Sequential(*ops)

    def __bool__(self) -> bool:
        return self.pipeline is not None

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.pipeline is None:
            return pixels
        expected = 5 if self.clips else 4
        if pixels.dtype != torch.uint8 or pixels.dim() != expected or pixels.shape[1] != 3:
            layout = "(N, 3, T, H, W)" if self.clips else "(N, 3, H, W)"
            raise ValueError(
                f"augmentation takes uint8 {layout} pixels, got {pixels.dtype} of shape {tuple(pixels.shape)}"
            )
        out = self.pipeline(pixels.float().div_(255.0))
        return out.mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)


def build_augmenter(cfg: AugmentConfig, clips: bool = False) -> Augmenter:
    """The :class:`Augmenter` for ``cfg.ops`` (images, or clips when ``clips``)."""
    return Augmenter([build_op(name, cfg) for name in cfg.ops], clips=clips)
