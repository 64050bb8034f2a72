"""Building blocks shared by the networks: in-model normalisation and residual blocks."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "Normalize", "make_stage"]


class Normalize(nn.Module):
    """uint8 pixels in, normalised float32 out: ``(x / 255 - mean) / std`` as one multiply-add.

    Living inside the model means training, ONNX export and serving all normalise identically
    (in ONNX it is a Cast, a Mul and an Add).
    """

    scale: torch.Tensor  # buffers, registered in __init__
    shift: torch.Tensor

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], spatial_dims: int) -> None:
        super().__init__()
        shape = (1, len(mean)) + (1,) * spatial_dims
        mean_t = torch.tensor(mean, dtype=torch.float32).view(shape)
        std_t = torch.tensor(std, dtype=torch.float32).view(shape)
        self.register_buffer("scale", 1.0 / (255.0 * std_t))
        self.register_buffer("shift", -mean_t / std_t)
        self.spatial_dims = spatial_dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            raise TypeError(f"the model takes uint8 pixels (it normalises inside), got {x.dtype}")
        if x.dim() != 2 + self.spatial_dims:
            raise ValueError(f"expected a {2 + self.spatial_dims}-d input, got shape {tuple(x.shape)}")
        return x.float() * self.scale + self.shift


class BasicBlock(nn.Module):
    """The ResNet-18/34 residual block, for 2-D (``conv=nn.Conv2d``) or 3-D convolutions."""

    expansion = 1

    def __init__(self, in_ch: int, out_ch: int, stride: int, dims: int = 2) -> None:
        super().__init__()
        conv, norm = (nn.Conv2d, nn.BatchNorm2d) if dims == 2 else (nn.Conv3d, nn.BatchNorm3d)
        self.conv1 = conv(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = norm(out_ch)
        self.conv2 = conv(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = norm(out_ch)
        # Zero-init the last BN so each block starts as identity: faster, steadier early training.
        nn.init.zeros_(self.bn2.weight)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(conv(in_ch, out_ch, 1, stride, bias=False), norm(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


def make_stage(in_ch: int, out_ch: int, blocks: int, stride: int, dims: int = 2) -> nn.Sequential:
    layers = [BasicBlock(in_ch, out_ch, stride, dims)]
    layers += [BasicBlock(out_ch, out_ch, 1, dims) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def init_weights(module: nn.Module) -> None:
    """He init for convolutions, unit/zero for norms (keeping zero-initialised last BNs)."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Conv3d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
