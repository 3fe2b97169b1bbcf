"""The single-stage WSSS model: ViT backbone, final and auxiliary CAM classifiers, LargeFOV decoder.

Inputs of any size work (see :mod:`wsss.models.backbone`): sizes that are not multiples of the patch size
``p`` (16 for DeiT-S/16) are zero-padded on the right and bottom, and every map the model returns is on
the ``ceil(H / p) x ceil(W / p)`` token grid of the padded image. :func:`resize_to_image` brings such a map
back to the exact pixels of the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from wsss.config import ModelConfig
from wsss.models.backbone import ViTBackbone, build_backbone
from wsss.models.heads import Classifier, LargeFOV

__all__ = ["ModelOutput", "WSSSModel", "build_model", "resize_to_image"]


@dataclass
class ModelOutput:
    """Named outputs of :meth:`WSSSModel.forward` (h, w: the token grid, stride = patch size).

    Attributes:
        logits: (B, C-1) final classifier logits.
        aux_logits: (B, C-1) auxiliary classifier logits.
        seg: (B, C, h, w) decoder logits at the token stride.
        features: (B, D, h, w) final patch tokens (after the final norm).
        aux_features: (B, D, h, w) patch tokens of the auxiliary block (without the final norm).
    """

    logits: torch.Tensor
    aux_logits: torch.Tensor
    seg: torch.Tensor
    features: torch.Tensor
    aux_features: torch.Tensor


class WSSSModel(nn.Module):
    """Backbone + auxiliary classifier on block ``aux_layer`` + final classifier + LargeFOV decoder.

    Args:
        backbone: The ViT backbone.
        num_classes: Classes C, background included (the classifiers predict the C - 1 foreground ones).
        aux_layer: Block (negative counts from the end) feeding the auxiliary classifier.
        decoder_channels: Hidden width of the decoder.
        decoder_dilation: Dilation of the decoder's 3x3 convs.
    """

    def __init__(
        self,
        backbone: ViTBackbone,
        num_classes: int,
        aux_layer: int = -3,
        decoder_channels: int = 512,
        decoder_dilation: int = 5,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes counts the background and must be >= 2, got {num_classes}")
        self.backbone = backbone
        self.num_classes = num_classes
        self.aux_layer = backbone.block_index(aux_layer)
        dim = backbone.embed_dim
        self.classifier = Classifier(dim, num_classes - 1)
        self.aux_classifier = Classifier(dim, num_classes - 1)
        self.decoder = LargeFOV(dim, num_classes, decoder_channels, decoder_dilation)

    @property
    def stride(self) -> int:
        """Output stride of the token maps (the patch size)."""
        return self.backbone.patch_size

    def forward(self, x: torch.Tensor) -> ModelOutput:
        """Images (B, 3, H, W), normalised -> :class:`ModelOutput`."""
        out = self.backbone(x, [self.aux_layer])
        features, aux_features = out.features, out.intermediates[0]
        return ModelOutput(
            logits=self.classifier(features),
            aux_logits=self.aux_classifier(aux_features),
            seg=self.decoder(features),
            features=features,
            aux_features=aux_features,
        )

    def cam(self, x: torch.Tensor, aux: bool = False) -> torch.Tensor:
        """Raw class activation maps (B, C-1, h, w) (before ReLU) of the final or the auxiliary classifier.

        The auxiliary CAM stops the backbone after the auxiliary block.
        """
        if aux:
            feats = self.backbone(x, [self.aux_layer], stop_early=True).intermediates[0]
            return self.aux_classifier.cam(feats)
        return self.classifier.cam(self.backbone(x).features)

    def pixel_cam(self, x: torch.Tensor, aux: bool = False) -> torch.Tensor:
        """:meth:`cam` brought to the exact pixels of ``x``: (B, C-1, H, W), aligned whether or not ``x`` was
        padded to a multiple of the patch size (see :func:`resize_to_image`)."""
        return resize_to_image(self.cam(x, aux=aux), x.shape[-2:], self.stride)

    def param_groups(self, lr: float, head_lr_mult: float, weight_decay: float) -> list[dict[str, Any]]:
        """Optimiser groups, each with a ``name``.

        ``backbone``: backbone weight matrices (lr, weight decay); ``backbone_no_decay``: norms, biases,
        position embedding, prefix tokens and other 1-D parameters (lr, no weight decay); ``heads``: both
        classifiers and the decoder (lr * head_lr_mult, weight decay).
        """
        vit = self.backbone.vit
        no_decay_names = set(vit.no_weight_decay())
        decay, no_decay = [], []
        for name, p in vit.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name in no_decay_names else decay).append(p)
        heads = [
            p for m in (self.classifier, self.aux_classifier, self.decoder) for p in m.parameters() if p.requires_grad
        ]
        return [
            {"name": "backbone", "params": decay, "lr": lr, "weight_decay": weight_decay},
            {"name": "backbone_no_decay", "params": no_decay, "lr": lr, "weight_decay": 0.0},
            {"name": "heads", "params": heads, "lr": lr * head_lr_mult, "weight_decay": weight_decay},
        ]


def resize_to_image(maps: torch.Tensor, image_size: tuple[int, int], stride: int) -> torch.Tensor:
    """Bilinearly upsample (B, K, h, w) token-grid maps to the pixels of an (H, W) input image.

    The maps cover the input padded to ``(h * stride, w * stride)``; they are upsampled to that size and
    cropped to ``image_size``, so each pixel lines up with its patch whether or not the input was padded.
    """
    h, w = maps.shape[-2:]
    full = F.interpolate(maps, size=(h * stride, w * stride), mode="bilinear", align_corners=False)
    return full[..., : image_size[0], : image_size[1]]


def build_model(cfg: ModelConfig, num_classes: int) -> WSSSModel:
    """The model described by ``cfg`` for ``num_classes`` classes (background included)."""
    backbone = build_backbone(
        cfg.backbone,
        pretrained=cfg.pretrained,
        attention=cfg.attention,
        drop_path_rate=cfg.drop_path_rate,
        backbone_kwargs=cfg.backbone_kwargs,
    )
    return WSSSModel(
        backbone,
        num_classes,
        aux_layer=cfg.aux_layer,
        decoder_channels=cfg.decoder_channels,
        decoder_dilation=cfg.decoder_dilation,
    )
