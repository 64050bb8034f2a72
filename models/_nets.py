"""The networks, written here (no torchvision: it has no CPU build on every machine we target).

Every network is a :class:`GpufeedModel`: uint8 pixels in, logits out, normalisation inside, its
:class:`~gpufeed.models.ModelSpec` attached as ``model.spec``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from gpufeed.models._layers import Normalize, init_weights, make_stage
from gpufeed.models._spec import ModelSpec

__all__ = ["GpufeedModel", "R3DSmall", "ResNet18", "SmallCNN", "StackedFrameResNet18"]


class GpufeedModel(nn.Module):
    """Normalise, then run the backbone. ``spec`` travels with the weights."""

    def __init__(self, spec: ModelSpec, backbone: nn.Module) -> None:
        super().__init__()
        self.spec = spec
        self.normalize = Normalize(spec.mean, spec.std, spatial_dims=spec.head.spatial_dims)
        self.backbone = backbone

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(pixels))


class _ResNetTrunk(nn.Module):
    """Stem + four stages of BasicBlocks (ResNet-18 layout), then global average pooling."""

    def __init__(self, in_ch: int, num_classes: int, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_ch, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        stages, ch = [], widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            stages.append(make_stage(ch, width, count, stride=1 if i == 0 else 2))
            ch = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(ch, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


class ResNet18(_ResNetTrunk):
    """ResNet-18 (He et al. 2016), torchvision's layout: 11.7 M parameters at 1000 classes."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(3, num_classes)


class SmallCNN(nn.Module):
    """A four-layer CNN (~0.1 M parameters) for serving tests where per-request overhead dominates."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        layers, ch = [], 3
        for width in (16, 32, 64, 96):
            layers += [nn.Conv2d(ch, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            ch = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(ch, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(dim=(2, 3)))


class StackedFrameResNet18(nn.Module):
    """A 2-D ResNet-18 over a clip's frames stacked as channels (DeepEthogram's flow-free recipe).

    Input ``(N, 3, T, H, W)`` becomes ``(N, 3T, H, W)``; the first convolution sees all frames at
    once, so motion is visible, at 2-D cost.
    """

    def __init__(self, num_classes: int, clip_length_frames: int) -> None:
        super().__init__()
        self.trunk = _ResNetTrunk(3 * clip_length_frames, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t, h, w = x.shape
        stem = cast(nn.Conv2d, self.trunk.stem[0]).weight
        if stem.is_contiguous(memory_format=torch.channels_last) and not stem.is_contiguous():
            # A channels_last stem (train.channels_last) is fed channels_last frames: the stacking
            # copy (a clip arrives channels_last_3d, whose C and T do not merge) writes that layout
            # directly, instead of an NCHW tensor that cuDNN would transpose again every forward.
            # Channel ci * t + ti is still colour ci of frame ti, as reshape orders them.
            return self.trunk(x.permute(0, 3, 4, 1, 2).contiguous().view(n, h, w, c * t).permute(0, 3, 1, 2))
        return self.trunk(x.reshape(n, c * t, h, w))


class R3DSmall(nn.Module):
    """A small 3-D ResNet (R3D-10 layout at half width) for clips ``(N, 3, T, H, W)``."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        widths = (32, 64, 128, 256)
        self.stem = nn.Sequential(
            nn.Conv3d(3, widths[0], (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
            nn.BatchNorm3d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages, ch = [], widths[0]
        for i, width in enumerate(widths):
            stages.append(make_stage(ch, width, 1, stride=1 if i == 0 else 2, dims=3))
            ch = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(ch, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.stages(self.stem(x)).mean(dim=(2, 3, 4)))
