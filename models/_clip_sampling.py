"""How a clip model's training read its frames, which scoring a whole video must repeat.

The frame gap within a clip (``video.stride_frames``) and the fit (``video.fit``) are training
settings, not facts of the network, so :class:`~gpufeed.models.ModelSpec` does not hold them: a
checkpoint carries them in its training config, and export copies them into the model card's
``extra.clip_sampling``, where ``gpufeed predict`` and the server's video input read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FITS", "ClipSampling"]

FITS = ("stretch", "centre_crop")


@dataclass(frozen=True)
class ClipSampling:
    """How a clip model's frames were read at training, which scoring must repeat.

    Attributes:
        stride_frames: Gap between consecutive frames of a clip (``video.stride_frames``).
        fit: ``stretch`` or ``centre_crop`` (``video.fit``).
    """

    stride_frames: int = 1
    fit: str = "stretch"

    def __post_init__(self) -> None:
        if not isinstance(self.stride_frames, int) or self.stride_frames < 1:
            raise ValueError(f"stride_frames {self.stride_frames!r} must be an integer >= 1")
        if self.fit not in FITS:
            raise ValueError(f"fit {self.fit!r} is not allowed; allowed: {', '.join(FITS)}")

    def to_dict(self) -> dict[str, Any]:
        return {"stride_frames": self.stride_frames, "fit": self.fit}

    @classmethod
    def from_config(cls, config: Any) -> ClipSampling:
        """From a training config mapping (a checkpoint's ``config``: its ``video`` section); defaults when absent."""
        video = config.get("video") if isinstance(config, dict) else None
        if not isinstance(video, dict):
            return cls()
        return cls(int(video.get("stride_frames", 1)), str(video.get("fit", "stretch")))

    @classmethod
    def from_card(cls, card: Any) -> ClipSampling:
        """From a model card's ``extra.clip_sampling`` (written by export); defaults for cards without it."""
        data = card.extra.get("clip_sampling") if isinstance(card.extra, dict) else None
        if not isinstance(data, dict):
            return cls()
        return cls(int(data.get("stride_frames", 1)), str(data.get("fit", "stretch")))
