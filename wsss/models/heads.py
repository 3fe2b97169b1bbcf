"""Heads on the (B, D, h, w) patch-token map: the CAM classifier and the LargeFOV segmentation decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Classifier", "LargeFOV"]


class Classifier(nn.Module):
    """Multi-label classifier whose weights also give class activation maps.

    Logits: global max pooling of the token map, then a bias-free 1x1 conv. CAM: the same 1x1 conv applied
    to every token (raw, before any ReLU).

    Args:
        in_channels: Token dimension D.
        num_classes: Foreground classes (C - 1).
        kaiming_init: Kaiming-normal (fan-in) weights instead of PyTorch's default init (the reference's).
    """

    def __init__(self, in_channels: int, num_classes: int, kaiming_init: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_classes, kernel_size=1, bias=False)
        if kaiming_init:
            nn.init.kaiming_normal_(self.conv.weight)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) -> logits (B, num_classes). Under an ONNX export the pooling is a plain maximum over the grid,
        the same values: torch 2.11's exporter has no ONNX function for ``adaptive_max_pool2d``."""
        if torch.onnx.is_in_onnx_export():
            return self.conv(features.amax(dim=(2, 3), keepdim=True)).flatten(1)
        return self.conv(F.adaptive_max_pool2d(features, 1)).flatten(1)

    def cam(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) -> raw class activation maps (B, num_classes, h, w)."""
        return self.conv(features)


class LargeFOV(nn.Module):
    """DeepLab-LargeFOV decoder: 3x3 conv (dilated) -> ReLU -> 3x3 conv (dilated) -> ReLU -> 1x1 conv.

    All convolutions are bias-free, as in the reference.

    Args:
        in_channels: Token dimension D.
        num_classes: Output classes C (background included).
        channels: Width of the two hidden convs.
        dilation: Dilation (and padding) of the two 3x3 convs.
        kaiming_init: Kaiming-normal (fan-out, ReLU) weights instead of PyTorch's default init (the reference's).
    """

    def __init__(self, in_channels: int, num_classes: int, channels: int, dilation: int, kaiming_init: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=dilation, dilation=dilation, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation, bias=False)
        self.cls = nn.Conv2d(channels, num_classes, 1, bias=False)
        if kaiming_init:
            for conv in (self.conv1, self.conv2, self.cls):
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D, h, w) -> segmentation logits (B, C, h, w) at the same stride."""
        x = F.relu(self.conv1(features))
        x = F.relu(self.conv2(x))
        return self.cls(x)
