"""A small UNet on a ResNet-18 encoder, for dense targets (depth maps, segmentation masks).

The encoder is the ResNet-18 layout of :class:`~gpufeed.models._nets.ResNet18` (stem at 1/4,
stages at 1/4, 1/8, 1/16, 1/32 of the input); the decoder upsamples 2x at a time, concatenating
the encoder's feature map of the same scale and running two 3x3 convolutions, back to 1/2, then
a 1x1 head and a bilinear 2x upsample give one map per output channel at the input's size.

==========  ====================================  ==========================================
task        output                                meaning
==========  ====================================  ==========================================
depth       (N, 1, H, W) float                    depth in the target's unit (depth_scale)
segment.    (N, C, H, W) float                    class scores (softmax over C)
==========  ====================================  ==========================================

Inputs of any height and width divisible by 32 keep every skip aligned; others are padded to
the next multiple of 32 and the output cropped back, so 256 x 192 and 96 x 72 both work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpufeed.models._layers import init_weights, make_stage

__all__ = ["UNetResNet18"]


def _conv_bn_relu(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch), nn.ReLU(True))


class _Up(nn.Module):
    """2x upsample, concatenate the skip, two 3x3 conv-BN-ReLU."""

    def __init__(self, in_ch: int, skip_ch: int, out_ch: int) -> None:
        super().__init__()
        self.convs = nn.Sequential(_conv_bn_relu(in_ch + skip_ch, out_ch), _conv_bn_relu(out_ch, out_ch))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
        return self.convs(torch.cat([x, skip], dim=1))


class UNetResNet18(nn.Module):
    """UNet decoder over a ResNet-18 encoder; ``out_channels`` maps at the input's size.

    Args:
        out_channels: 1 for depth, the number of classes for segmentation.
        decoder_widths: Channels of the four decoder stages (1/16 to 1/2 scale).
    """

    def __init__(self, out_channels: int, decoder_widths: tuple[int, ...] = (256, 128, 64, 32)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.stages = nn.ModuleList(
            [
                make_stage(64, 64, 2, 1),
                make_stage(64, 128, 2, 2),
                make_stage(128, 256, 2, 2),
                make_stage(256, 512, 2, 2),
            ]
        )
        d1, d2, d3, d4 = decoder_widths
        self.ups = nn.ModuleList([_Up(512, 256, d1), _Up(d1, 128, d2), _Up(d2, 64, d3), _Up(d3, 64, d4)])
        self.head = nn.Conv2d(d4, out_channels, 1)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        pad_h, pad_w = (-height) % 32, (-width) % 32
        if pad_h or pad_w:  # every scale down to 1/32 must halve exactly for the skips to line up
            x = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
        half = self.stem(x)  # 1/2, 64 channels
        skips = [half]
        y = self.pool(half)
        for stage in self.stages:
            y = stage(y)
            skips.append(y)  # 1/4, 1/8, 1/16, 1/32
        y = skips.pop()
        for up in self.ups:
            y = up(y, skips.pop())
        y = F.interpolate(self.head(y), scale_factor=2.0, mode="bilinear", align_corners=False)
        return y[..., :height, :width]
