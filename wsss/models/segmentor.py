"""The single-stage WSSS model: ViT backbone, final and auxiliary CAM classifiers, LargeFOV decoder.

Inputs of any size work (see :mod:`wsss.models.backbone`): sizes that are not multiples of the patch size
``p`` (16 for DeiT-S/16) are zero-padded on the right and bottom, and every map :meth:`WSSSModel.forward`
returns is on the ``ceil(H / p) x ceil(W / p)`` token grid of the padded image. :func:`resize_to_image` brings
such a map back to the exact pixels of the input; :func:`cover_image` does so only where padding happened.
:func:`maps_to_pixels` resizes with ``F.interpolate(..., mode="bilinear", align_corners=False)``; :class:`PixelResize`
computes the same function as one matrix product per axis, whose backward needs no atomics on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wsss.models.backbone import ViTBackbone
from wsss.models.heads import Classifier, LargeFOV

__all__ = [
    "ModelOutput",
    "PixelResize",
    "WSSSModel",
    "bilinear_matrix",
    "cover_image",
    "maps_to_pixels",
    "resize_to_image",
]


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
        kaiming_init: Kaiming-normal init of the classifiers and the decoder instead of PyTorch's default.
    """

    def __init__(
        self,
        backbone: ViTBackbone,
        num_classes: int,
        aux_layer: int,
        decoder_channels: int,
        decoder_dilation: int,
        kaiming_init: bool,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes counts the background and must be >= 2, got {num_classes}")
        self.backbone = backbone
        self.num_classes = num_classes
        self.aux_layer = backbone.block_index(aux_layer)
        dim = backbone.embed_dim
        self.classifier = Classifier(dim, num_classes - 1, kaiming_init)
        self.aux_classifier = Classifier(dim, num_classes - 1, kaiming_init)
        self.decoder = LargeFOV(dim, num_classes, decoder_channels, decoder_dilation, kaiming_init)

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
        """Raw class activation maps (before ReLU) of the final or the auxiliary classifier, covering exactly
        the pixels of ``x``: (B, C-1, h, w) on the token grid when H and W are multiples of the patch size,
        else brought to (B, C-1, H, W) with the padding cropped (:func:`cover_image`).

        The auxiliary CAM stops the backbone after the auxiliary block.
        """
        if aux:
            feats = self.backbone(x, [self.aux_layer], stop_early=True).intermediates[0]
            maps = self.aux_classifier.cam(feats)
        else:
            maps = self.classifier.cam(self.backbone(x).features)
        return cover_image(maps, x.shape[-2:], self.stride)

    def param_groups(self, lr: float, head_lr_mult: float, weight_decay: float, no_decay_1d: bool) -> list[dict]:
        """Optimiser groups, each with a ``name``; frozen parameters (``requires_grad`` False) are left out.

        ``backbone``: backbone weight matrices (lr, weight decay); ``backbone_1d``: norms, biases, position
        embedding, prefix tokens and other 1-D parameters (lr; weight decay unless ``no_decay_1d``); ``heads``:
        both classifiers and the decoder (lr * head_lr_mult, weight decay). The reference decays every group.
        """
        vit = self.backbone.vit
        one_d_names = set(vit.no_weight_decay())
        matrices, one_d = [], []
        for name, p in vit.named_parameters():
            if p.requires_grad:
                (one_d if p.ndim <= 1 or name in one_d_names else matrices).append(p)
        heads = [
            p for m in (self.classifier, self.aux_classifier, self.decoder) for p in m.parameters() if p.requires_grad
        ]
        return [
            {"name": "backbone", "params": matrices, "lr": lr, "weight_decay": weight_decay},
            {"name": "backbone_1d", "params": one_d, "lr": lr, "weight_decay": 0.0 if no_decay_1d else weight_decay},
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


def cover_image(maps: torch.Tensor, image_size: tuple[int, int], stride: int) -> torch.Tensor:
    """Token-grid maps of an (H, W) image -> maps whose extent is exactly the image.

    When H and W are multiples of ``stride`` the grid covers the image exactly and is returned as is (so a
    later bilinear resize goes straight from the grid, as the reference does); otherwise it also covers the
    padding and :func:`resize_to_image` crops that away at pixel resolution.
    """
    if image_size[0] % stride == 0 and image_size[1] % stride == 0:
        return maps
    return resize_to_image(maps, image_size, stride)


def maps_to_pixels(
    maps: torch.Tensor, image_size: tuple[int, int], stride: int, size: tuple[int, int] | None = None
) -> torch.Tensor:
    """Token-grid maps of an image of ``image_size`` -> (B, K, *size) bilinearly resized pixels (``size``
    defaults to ``image_size``): :func:`cover_image`, then one resize unless already at ``size``."""
    size = tuple(image_size if size is None else size)
    maps = cover_image(maps, image_size, stride)
    if tuple(maps.shape[-2:]) != size:
        maps = F.interpolate(maps, size=size, mode="bilinear", align_corners=False)
    return maps


def bilinear_matrix(n_in: int, n_out: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The (n_out, n_in) float32 weights of a bilinear resize along one axis, ``align_corners=False``.

    Output ``o`` samples the input at ``s = (o + 0.5) * n_in / n_out - 0.5``, clamped to ``[0, n_in - 1]``, with
    weight ``max(0, 1 - |s - i|)`` on input ``i``: ``1 - frac(s)`` and ``frac(s)`` on its two neighbours, as
    ``F.interpolate`` weighs them (which puts both on the last input past the end, where the clamp puts 1).
    """
    src = (torch.arange(n_out, dtype=torch.float32, device=device) + 0.5) * (n_in / n_out) - 0.5
    offsets = src.clamp(0, n_in - 1)[:, None] - torch.arange(n_in, dtype=torch.float32, device=device)
    return (1 - offsets.abs()).clamp(min=0)


class PixelResize:
    """:func:`maps_to_pixels` as ``rows @ maps @ cols.T``: each axis's resizes (and crop) folded into one matrix.

    The same function, rounded in another order (float32 weights, products in the maps' dtype: TF32 on a GPU under
    ``torch.set_float32_matmul_precision("high")``). Its backward is two matrix products, where ``F.interpolate``'s
    adds each output pixel's gradient into its four inputs with CUDA atomics: from the paper's 16x upsample up to 1,600
    adds land on one logit, serialised, in an order that changes from run to run. The weights are made once
    per shape, device and dtype and held (a training step resizes the same shapes every iteration).
    """

    def __init__(self) -> None:
        self._weights: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(
        self, maps: torch.Tensor, image_size: tuple[int, int], stride: int, size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """(B, K, h, w) token-grid maps -> (B, K, *size) pixels, as :func:`maps_to_pixels`."""
        size = tuple(image_size if size is None else size)
        key = (tuple(maps.shape[-2:]), tuple(image_size), stride, size, maps.device, maps.dtype)
        if key not in self._weights:
            padded = image_size[0] % stride != 0 or image_size[1] % stride != 0
            self._weights[key] = tuple(
                self._axis(n, image_size[i], size[i], stride, padded, maps.device).to(maps.dtype)
                for i, n in enumerate(maps.shape[-2:])
            )
        rows, cols = self._weights[key]
        return rows @ (maps @ cols.T)

    @staticmethod
    def _axis(n_grid: int, n_image: int, n_out: int, stride: int, padded: bool, device: torch.device) -> torch.Tensor:
        """(n_out, n_grid) weights of one axis: :func:`cover_image` (to the padded pixels, cropped to the image,
        where either axis was padded), then the resize to ``n_out`` where the sizes differ."""
        if not padded:
            return bilinear_matrix(n_grid, n_out, device)
        cover = bilinear_matrix(n_grid, n_grid * stride, device)[:n_image]
        return cover if n_image == n_out else bilinear_matrix(n_image, n_out, device) @ cover
