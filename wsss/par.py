"""Pixel-adaptive refinement (PAR, Ru et al., AFA, CVPR 2022).

Each pixel ``i`` has ``8 * len(dilations)`` neighbours: the 8 cells of a 3x3 ring scaled by each
dilation ``d``, i.e. offsets ``(dy, dx) in {-d, 0, d}^2 \\ {(0, 0)}`` (48 for the default dilations).
Out-of-image neighbours are read with replicate padding (coordinates clamped to the border). The
centre pixel is not a neighbour of itself.

Affinity of pixel ``i`` to its neighbour ``k`` (``(B, K, H, W)``, K neighbours):

- colour term: per colour channel ``c``, ``-(|I_k - I_i| / (std_c + 1e-8) / w1) ** 2`` where
  ``std_c`` is the (unbiased) standard deviation of ``I_k`` over the K neighbours of ``i`` in that
  channel; averaged over the colour channels, then softmax over the K neighbours;
- position term: the neighbour's Euclidean distance ``r_k`` (``d`` for the 4 axial neighbours,
  ``d * sqrt(2)`` for the 4 diagonal ones), scored ``-(r_k / (std_r + 1e-8) / w1) ** 2`` with ``std_r``
  the unbiased std of the K distances, softmax over the K neighbours. It does not depend on the pixel
  or the image: a fixed prior favouring near neighbours (with the defaults it puts 0.58 of its mass on
  the dilation-1 ring and 0.36 on the dilation-2 ring);
- ``affinity = softmax(colour) + w2 * softmax(position)``.

Every pixel's affinities sum to ``1 + w2`` (not renormalised, as in AFA/ToCo): each iteration scales
all channels of a pixel alike, which leaves the argmax taken downstream unchanged.

Refinement: ``num_iter`` times, ``mask_i <- sum_k affinity_ik * mask_k`` for every channel.

Two implementations of the same formulas (``par.kernel``): PyTorch operations (``torch``: one per neighbour and
step, 513 launches per call of the paper's PAR on a GPU) and Triton kernels (``fused``, :mod:`wsss.par_kernel`:
1 + ``num_iter`` launches); ``auto`` takes the kernels for CUDA tensors when triton is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsss.config import PAR_KERNELS, ParConfig

try:  # optional: triton ships with the CUDA builds of torch; without it the PyTorch version runs everywhere
    from wsss import par_kernel
except ModuleNotFoundError as err:  # pragma: no cover - depends on the install
    if err.name != "triton":
        raise
    par_kernel = None

STD_EPS = 1e-8

_RING = ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1))


def neighbour_offsets(dilations: Sequence[int]) -> list[tuple[int, int]]:
    """The ``(dy, dx)`` offsets of the PAR neighbourhood, 8 per dilation, dilation-major."""
    return [(dy * d, dx * d) for d in dilations for dy, dx in _RING]


def _neighbours(x: Tensor, offsets: Sequence[tuple[int, int]], pad: int):
    """Yield, per offset, the view of ``x`` (``(..., H, W)``) shifted so that pixel ``(y, x)`` holds
    the value at ``(clamp(y + dy), clamp(x + dx))``."""
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    padded = F.pad(x.reshape(-1, 1, h, w), [pad] * 4, mode="replicate").reshape(*lead, h + 2 * pad, w + 2 * pad)
    for dy, dx in offsets:
        yield padded[..., pad + dy : pad + dy + h, pad + dx : pad + dx + w]


class PAR(nn.Module):
    """Pixel-adaptive refinement of per-pixel scores (e.g. CAM probabilities) guided by an image.

    Args:
        dilations: Dilations of the 3x3 neighbour rings.
        num_iter: Propagation steps.
        w1: Temperature of the colour and position terms.
        w2: Weight of the position term.
        kernel: ``"torch"``, ``"fused"`` or ``"auto"`` (module docstring).
    """

    def __init__(self, dilations: Sequence[int], num_iter: int, w1: float, w2: float, kernel: str):
        super().__init__()
        if not dilations or min(dilations) < 1:
            raise ValueError(f"PAR dilations must be positive integers, got {tuple(dilations)}")
        if kernel not in PAR_KERNELS:
            raise ValueError(f"unknown PAR kernel {kernel!r}; valid: {', '.join(PAR_KERNELS)}")
        if kernel == "fused" and par_kernel is None:
            raise ModuleNotFoundError("par.kernel='fused' needs the triton package (pip install triton)")
        self.dilations = tuple(int(d) for d in dilations)
        self.num_iter = num_iter
        self.w1 = w1
        self.w2 = w2
        self.kernel = kernel
        self.offsets = neighbour_offsets(self.dilations)
        self.register_buffer("position", self._position_affinity(), persistent=False)  # on the device with .to()
        dy, dx = zip(*self.offsets, strict=True)  # the kernels' offsets, also buffers: no upload per call
        self.register_buffer("dy", torch.tensor(dy, dtype=torch.int32), persistent=False)
        self.register_buffer("dx", torch.tensor(dx, dtype=torch.int32), persistent=False)

    @classmethod
    def from_config(cls, cfg: ParConfig) -> PAR:
        """PAR with the constants of a :class:`wsss.config.ParConfig` (its ``scale`` is the caller's)."""
        return cls(cfg.dilations, cfg.num_iter, cfg.w1, cfg.w2, cfg.kernel)

    def extra_repr(self) -> str:
        return f"dilations={self.dilations}, num_iter={self.num_iter}, w1={self.w1}, w2={self.w2}, kernel={self.kernel}"

    def fused_for(self, x: Tensor) -> bool:
        """Whether ``x`` goes through the Triton kernels: ``fused``, or ``auto`` with a CUDA tensor and triton."""
        if self.kernel == "auto":
            return x.device.type == "cuda" and par_kernel is not None
        return self.kernel == "fused"

    def position_affinity(self) -> Tensor:
        """The position term ``w2 * softmax(-(r / std_r / w1) ** 2)`` over the K neighbours, ``(K,)``, on this
        module's device (a buffer: made once, as a tensor from host values is a blocking copy to a GPU)."""
        return self.position

    def _position_affinity(self) -> Tensor:
        r = torch.tensor([math.hypot(dy, dx) for dy, dx in self.offsets], dtype=torch.float64)
        score = -((r / (r.std() + STD_EPS) / self.w1) ** 2)
        return (self.w2 * score.softmax(0)).float()

    def affinity(self, images: Tensor) -> Tensor:
        """Affinities of every pixel to its K neighbours.

        Args:
            images: ``(B, 3, H, W)``, any colour scale (the colour term is scale invariant up to
                the 1e-8); AFA/ToCo use [0, 1].

        Returns:
            ``(B, K, H, W)`` float32, each pixel's K values summing to ``1 + w2``.
        """
        if self.fused_for(images):
            return par_kernel.affinity(images, self.dy, self.dx, self.position_affinity(), self.w1, STD_EPS)
        images = images.float()
        pad = max(self.dilations)
        nb = torch.stack(list(_neighbours(images, self.offsets, pad)), dim=2)  # (B, 3, K, H, W)
        std = nb.std(dim=2, keepdim=True)
        colour = -(((nb - images.unsqueeze(2)).abs() / (std + STD_EPS) / self.w1) ** 2)
        aff = colour.mean(dim=1).softmax(dim=1)
        return aff + self.position_affinity().to(aff.device)[None, :, None, None]

    def propagate(self, affinity: Tensor, masks: Tensor) -> Tensor:
        """``num_iter`` steps of ``mask_i <- sum_k affinity_ik * mask_k``.

        Args:
            affinity: ``(B, K, H, W)`` from :meth:`affinity`.
            masks: ``(B, C, H, W)``.

        Returns:
            Refined masks ``(B, C, H, W)`` float32.
        """
        if self.fused_for(masks):
            return par_kernel.propagate(affinity, masks, self.dy, self.dx, self.num_iter)
        pad = max(self.dilations)
        masks = masks.float()
        for _ in range(self.num_iter):
            out = torch.zeros_like(masks)
            for k, shifted in enumerate(_neighbours(masks, self.offsets, pad)):
                out.addcmul_(affinity[:, k : k + 1], shifted)
            masks = out
        return masks

    def forward(self, images: Tensor, masks: Tensor) -> Tensor:
        """Refine ``masks`` with the affinities of ``images``.

        Args:
            images: ``(B, 3, H, W)`` guidance images, [0, 1] in AFA/ToCo.
            masks: ``(B, C, H, W)`` scores at the same resolution (resize them beforehand).

        Returns:
            ``(B, C, H, W)`` float32 refined scores.
        """
        if images.shape[-2:] != masks.shape[-2:] or images.shape[0] != masks.shape[0]:
            raise ValueError(
                f"PAR needs images and masks of the same batch and size, got {tuple(images.shape)} "
                f"and {tuple(masks.shape)}"
            )
        return self.propagate(self.affinity(images), masks)
