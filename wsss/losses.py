"""Training losses: multi-label classification, balanced segmentation CE, dense energy regulariser.

The dense energy loss is the regularised loss of Tang et al. 2018 ("On Regularized Losses for
Weakly-supervised CNN Segmentation") with the gating and constants of the ToCo release, in PyTorch (no compiled
extension), by default evaluated exactly:

    E = -(1 / B) * sum_b sum_i g_i sum_k S_ik (W S_k)_i,
    W_ij = exp(-|p_i - p_j|^2 / (2 sigma_xy'^2) - |I_i - I_j|^2 / (2 sigma_rgb^2)),

over the pixels ``i, j`` inside the valid crop region (``W_ii = 1`` included), at ``scale_factor``
times the crop resolution, where

- ``S`` are the segmentation probabilities (bilinearly resized), ``I`` the RGB image in 0..255
  (nearest resized), ``p`` pixel coordinates of the resized image and ``sigma_xy' = sigma_xy *
  scale_factor`` (so ``sigma_xy`` is in pixels of the full-resolution crop: 100 -> 50 at scale 0.5);
- ``g`` is ToCo's gate, detached: ``1 - max_k S_ik`` on pseudo-labelled pixels, 1 on pixels whose
  pseudo label is the ignore index, 0 outside the valid region;
- the gradient is ToCo's rule ``dE/dS_ik = -(2 / B) g_i (W S_k)_i`` (inside the valid region). It
  is the exact gradient when ``g`` is uniform; with a non-uniform gate the exact gradient of the
  expression above would be ``-(1 / B) (g_i (W S_k)_i + (W (g S_k))_i)``. ToCo's rule is kept: it is
  what the reference training ran, and it reads as "regularise the uncertain pixels towards their
  bilateral neighbourhood".

Weights (our reading of docs/design.md "weight 1e-7 inside, 0.05 outside"): ``1e-7`` is the module's own
``weight`` (multiplying ``E``, as ToCo's ``DenseEnergyLoss(weight=1e-7, ...)``) and ``0.05`` is the
coefficient of the returned loss in the total loss (``LossConfig.reg_weight``).

ToCo evaluates ``W S`` with a permutohedral lattice (Adams et al. 2010, the ``bilateralfilter`` extension
of meng-tang/rloss), an approximation of the same Gaussian with a narrower effective kernel. ``kernel="lattice"``,
the default (below), is that lattice; the exact kernels compute ``W S`` exactly, by dense blocked evaluation
(:func:`gaussian_filter_dense`, CPU) or by a fused Triton kernel (:func:`wsss.energy_kernel.gaussian_filter_fused`,
CUDA), see :func:`gaussian_filter`. Calibration of their weight against the
real lattice (rloss 1caa759 built from source, called exactly as ToCo e13514d calls it): on 33 crops of 448
from 7 colour photographs (21 full crops, 12 with black padding and a smaller valid box) and three kinds of
segmentation softmax each, the lattice's gradient norm was 0.593 +- 0.024 (0.55-0.63) times the exact one,
its loss 0.592 times, gradient cosine 0.997 (>= 0.9945). Narrower sigmas instead (x0.8) match the loss on
average but turn the gradient (cosine 0.984) and vary 3x more between images. So the exact kernel keeps
ToCo's sigmas and its weight is scaled: ``LossConfig.reg_lattice_match = 0.59`` multiplies
``reg_energy_weight = 1e-7`` (:meth:`DenseEnergyLoss.from_config`). docs/reference.md has the method.

``kernel="lattice"`` (``loss.reg_kernel``, the default) evaluates ``W S`` with the reference's lattice itself
(:func:`lattice_filter`: the CRF's permutohedral lattice, which is rloss's), at ToCo's weight: ToCo's loss to
7.7e-6 and its gradient to 2.9e-7 of the largest entry (docs/reference.md), in about 2 % of the blocked version's
time on a CPU at the paper setting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsss.config import ENERGY_KERNELS, LossConfig
from wsss.inference.crf.permutohedral import FixedBox, build_lattice, fixed_box, kernels, workspace_for
from wsss.utils.tensors import fp32_precision

try:  # optional: triton ships with the CUDA builds of torch; without it the blocked version runs everywhere
    from wsss import energy_kernel
except ModuleNotFoundError as err:  # pragma: no cover - depends on the install
    if err.name != "triton":
        raise
    energy_kernel = None


def multilabel_soft_margin(logits: Tensor, labels: Tensor) -> Tensor:
    """Multi-label soft-margin loss (equal to ``F.multilabel_soft_margin_loss``).

    Args:
        logits: ``(B, C-1)`` class scores.
        labels: ``(B, C-1)`` multi-hot targets.

    Returns:
        Scalar: the mean over images and classes of
        ``-(y log sigmoid(x) + (1 - y) log sigmoid(-x))``.
    """
    labels = labels.to(logits.dtype)
    per_class = -(labels * F.logsigmoid(logits) + (1 - labels) * F.logsigmoid(-logits))
    return per_class.mean()


def balanced_seg_ce(seg_logits: Tensor, pseudo_label: Tensor, ignore_index: int) -> Tensor:
    """Background/foreground balanced cross-entropy: ``0.5 CE(bg pixels) + 0.5 CE(fg pixels)``.

    Each part is the mean pixel CE over its own pixels (label 0 for background, any other label but
    ``ignore_index`` for foreground). A part with no pixels contributes 0 (with the other part keeping
    its 0.5 weight), so batches without background or without foreground give finite losses.

    Args:
        seg_logits: ``(B, C, h, w)`` segmentation logits; resized bilinearly
            (``align_corners=False``) to the label size here when ``(h, w)`` differs, as ToCo does
            before its loss.
        pseudo_label: ``(B, H, W)`` integer labels in ``[0, C)`` or ``ignore_index``.
        ignore_index: Label excluded from both parts.

    Returns:
        Scalar loss.
    """
    if seg_logits.shape[-2:] != pseudo_label.shape[-2:]:
        seg_logits = F.interpolate(seg_logits, size=pseudo_label.shape[-2:], mode="bilinear", align_corners=False)
    pseudo_label = pseudo_label.long()
    ce = F.cross_entropy(seg_logits, pseudo_label, ignore_index=ignore_index, reduction="none")
    bg = pseudo_label == 0
    fg = (pseudo_label != 0) & (pseudo_label != ignore_index)
    bg_loss = (ce * bg).sum() / bg.sum().clamp(min=1)
    fg_loss = (ce * fg).sum() / fg.sum().clamp(min=1)
    return 0.5 * (bg_loss + fg_loss)


def default_block_size(device: torch.device) -> int:
    """Block edge of :func:`gaussian_filter_dense`.

    1024 on CPU: 4 MiB tiles; single-threaded within 10% of the fastest of 256-4096, with 16x fewer tiles
    than 256. 8192 on GPU: fewer, larger kernels (one 256 MiB float32 tile buffer).
    """
    return 8192 if device.type == "cuda" else 1024


def _split_bf16(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x = hi + lo`` with ``hi`` = ``x`` truncated to bfloat16 precision (8 significant bits, so exact
    in bf16 and TF32) and ``lo`` the float32 remainder (at most 2^-7 |x|)."""
    hi = (x.contiguous().view(torch.int32) & -65536).view(torch.float32)
    return hi, x - hi


def kernel_exponent_factors(features: Tensor) -> tuple[Tensor, Tensor]:
    """Float32 factors ``L (n, 4(D+2))``, ``R (4(D+2), n)`` with ``(L @ R)_ij = -|f_i - f_j|^2 / 2``.

    With mean-centred features and ``a_i = [f_i, -|f_i|^2 / 2, 1]``, ``b_j = [f_j, 1, -|f_j|^2 / 2]``,
    ``a_i . b_j = -|f_i - f_j|^2 / 2``. Each factor is split into a bf16-exact high part and a remainder,
    ``a . b = a_hi.b_hi + a_hi.b_lo + a_lo.b_hi + a_lo.b_lo``: a matmul that rounds its float32 inputs
    (TF32, or bf16 under ``set_float32_matmul_precision("medium")``) then errs by ~2^-18 (TF32) or
    ~2^-15 (bf16) of each ``|a_k b_k|`` instead of 2^-11 or 2^-8: for random 0..255 colours at sigma 15
    the largest exponent error is 5e-4 instead of 0.14 (TF32) and 3.5e-3 instead of 1.1 (bf16), see
    ``tests/test_losses.py``. In IEEE float32 the split is exact. :func:`gaussian_filter_dense` computes its
    products in IEEE float32 whatever ``train.fp32_precision`` says; the split keeps any other caller's exponents
    accurate under TF32 or bf16 products.

    Args:
        features: ``(n, D)`` point features already divided by their bandwidths.
    """
    f = features.double()
    f = f - f.mean(dim=0, keepdim=True)
    half_sq = -0.5 * (f * f).sum(dim=1, keepdim=True)
    ones = torch.ones_like(half_sq)
    a_hi, a_lo = _split_bf16(torch.cat([f, half_sq, ones], dim=1).float())
    b_hi, b_lo = _split_bf16(torch.cat([f, ones, half_sq], dim=1).float())
    left = torch.cat([a_hi, a_hi, a_lo, a_lo], dim=1)
    right = torch.cat([b_hi, b_lo, b_hi, b_lo], dim=1)
    return left, right.T


def gaussian_filter_dense(features: Tensor, values: Tensor, block_size: int | None = None) -> Tensor:
    """Exact Gaussian filtering ``out_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j`` over all point pairs.

    Evaluated in square tiles of ``block_size`` points; the kernel is symmetric, so each off-diagonal
    tile is computed once and used for both of its blocks (half the exponentials). A tile is one matmul
    of :func:`kernel_exponent_factors` (the exponents), an in-place ``exp`` and two matmuls with the
    values, in one reused float32 buffer, all in IEEE float32 on a GPU too (TF32 products, the training run's
    default, would round each kernel value to 10 bits); no autograd graph is kept.

    Args:
        features: ``(n, D)`` point features already divided by their bandwidths.
        values: ``(n, K)`` values to filter.
        block_size: Tile edge; default :func:`default_block_size`.

    Returns:
        ``(n, K)`` float32.
    """
    n = features.shape[0]
    block = min(block_size or default_block_size(features.device), max(n, 1))
    with torch.no_grad(), torch.autocast(features.device.type, enabled=False), fp32_precision("ieee"):
        left, right_t = kernel_exponent_factors(features)
        v = values.float()
        out = torch.zeros_like(v)
        buf = torch.empty(block * block, dtype=torch.float32, device=features.device)
        for i0 in range(0, n, block):
            i1 = min(i0 + block, n)
            for j0 in range(i0, n, block):
                j1 = min(j0 + block, n)
                shape = (i1 - i0, j1 - j0)
                kern = torch.mm(left[i0:i1], right_t[:, j0:j1], out=buf[: shape[0] * shape[1]].view(shape))
                kern.exp_()
                out[i0:i1].addmm_(kern, v[j0:j1])
                if j0 != i0:
                    out[j0:j1].addmm_(kern.T, v[i0:i1])
    return out


def gaussian_filter(features: Tensor, values: Tensor, kernel: str, block_size: int | None) -> Tensor:
    """Exact Gaussian filtering ``out_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j`` by the chosen implementation.

    Args:
        features: ``(n, D)`` point features already divided by their bandwidths.
        values: ``(n, K)`` values to filter.
        kernel: ``"blocked"``: :func:`gaussian_filter_dense`; ``"fused"``: the Triton kernel
            :func:`wsss.energy_kernel.gaussian_filter_fused` (CUDA, or CPU under ``TRITON_INTERPRET=1``);
            ``"auto"``: fused for CUDA tensors when triton is installed, blocked otherwise.
        block_size: Tile edge of the blocked version (None: :func:`default_block_size`); the fused kernel has
            its own blocks.

    Returns:
        ``(n, K)`` float32.
    """
    if kernel not in ENERGY_KERNELS or kernel == "lattice":
        exact = [k for k in ENERGY_KERNELS if k != "lattice"]
        raise ValueError(f"unknown exact energy kernel {kernel!r}; valid: {', '.join(exact)} (the lattice: "
                         "lattice_filter)")  # fmt: skip
    if kernel == "auto":
        use_fused = features.device.type == "cuda" and energy_kernel is not None
        kernel = "fused" if use_fused else "blocked"
    if kernel == "blocked":
        return gaussian_filter_dense(features, values, block_size)
    if energy_kernel is None:
        raise ModuleNotFoundError("loss.reg_kernel='fused' needs the triton package (pip install triton)")
    return energy_kernel.gaussian_filter_fused(features, values)


RGB_RANGE = (-1.0, 256.0)
"""The colours (0..255, de-normalised crops) a fixed lattice box of the energy covers, with a margin for rounding."""
BOX_MARGIN_PIXELS = 1.0
"""The margin of a fixed lattice box's positions past a crop's pixels, in pixels: CUDA divides a tensor by a number
as the product with its reciprocal, one float32 ulp above the quotient at times (``19 * (1/7) > 19/7``); without it
the last row or column of such a crop fell outside the box, and the loss was NaN (an H200, 2026-11-28)."""


def lattice_filter(features: Tensor, values: Tensor, box: FixedBox | None = None, fused: bool | None = None) -> Tensor:
    """``W S`` by the permutohedral lattice, as the reference computes it (ToCo's ``DenseEnergyLoss`` calls the
    ``bilateralfilter`` of meng-tang/rloss: pydensecrf's lattice built with SSE, padding included, one lattice per
    image, each channel filtered alike).

    Args:
        features: ``(B, n, D)`` point features already divided by their bandwidths, one lattice per image.
        values: ``(B, n, K)`` values to filter.
        box: The lattice's codes fixed in advance (:func:`wsss.inference.crf.permutohedral.fixed_box`, for B images
            whose features lie within its bounds), so that nothing is read back from the device (a CUDA graph can
            capture the step); None: from the features' range. A feature outside the box's bounds makes the
            whole result NaN (a wrong lattice otherwise).
        fused: Build and filter with the CRF's Triton kernels (:meth:`Lattice.filter_fused`), or PyTorch's sparse
            products; None: the kernels on CUDA where triton is installed.

    Returns:
        ``(B, n, K)`` float32.
    """
    b, n, d = features.shape
    if fused is None:
        fused = features.device.type == "cuda" and kernels is not None
    with torch.no_grad(), torch.autocast(features.device.type, enabled=False):  # float32 products, as the reference
        flat = features.reshape(b * n, d).float().contiguous()
        lattice = build_lattice(flat, [n] * b, reference_padding=True, fused=fused, box=box)
        v = values.reshape(b * n, -1).float().contiguous()
        workspace = workspace_for([lattice], v.shape[1], torch.float32, v.device)
        if fused:
            out = lattice.filter_fused(v, torch.empty_like(v), workspace)
        else:
            out = lattice.filter(v, workspace=workspace)
        if box is not None:
            outside = (flat < box.bounds[0]) | (flat > box.bounds[1])
            out = torch.where(outside.any(), torch.nan, out)
    return out.view(b, n, -1)


class _DenseEnergy(torch.autograd.Function):
    """``E = -(1/B) sum_b sum_i g_i S_i . (W S)_i`` with ToCo's gradient ``-(2/B) g (W S)``.

    Every image is filtered on its whole grid, with ``S`` zeroed outside ``roi`` (those pixels then add nothing
    as columns) and ``g`` zeroed there (nothing as rows, no gradient): the same numbers as filtering the roi
    pixels alone with the exact kernels, with shapes that do not depend on the data, so nothing waits for the
    device. The lattice's points are those of the whole grid, as the reference's (rloss filters the whole grid with
    ``S`` zeroed outside the roi).
    """

    @staticmethod
    def forward(ctx, probs: Tensor, features: Tensor, roi: Tensor, gate: Tensor, block_size: int | None, kernel: str,
                lattice: dict):  # fmt: skip
        b, k, h, w = probs.shape
        inside = roi.reshape(b, 1, h * w).float()
        s_all = probs.detach().float().reshape(b, k, h * w) * inside
        g_all = gate.float().reshape(b, 1, h * w) * inside
        f_all = features.float().reshape(b, -1, h * w)
        if kernel == "lattice":
            gws = g_all.transpose(1, 2) * lattice_filter(f_all.transpose(1, 2), s_all.transpose(1, 2), **lattice)
        else:
            gws = torch.stack([g_all[i].T * gaussian_filter(f_all[i].T, s_all[i].T, kernel, block_size)
                               for i in range(b)])  # fmt: skip
        energy = -(s_all.transpose(1, 2) * gws).sum(dtype=torch.float64)
        ctx.save_for_backward((-2.0 / b) * gws.transpose(1, 2).reshape(b, k, h, w))
        return (energy / b).to(probs.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (grad,) = ctx.saved_tensors
        return (grad_output * grad).to(grad_output.dtype), None, None, None, None, None, None


def bilateral_features(images: Tensor, sigma_rgb: float, sigma_xy: float) -> Tensor:
    """Bilateral features ``(x / sigma_xy, y / sigma_xy, r / sigma_rgb, g / sigma_rgb, b / sigma_rgb)``.

    Args:
        images: ``(B, 3, h, w)`` RGB images (0..255 for the reference bandwidths).
        sigma_rgb: Colour bandwidth.
        sigma_xy: Spatial bandwidth in pixels of ``images``.

    Returns:
        ``(B, 5, h, w)`` float32; x is the column index, y the row index.
    """
    b, _, h, w = images.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, device=images.device, dtype=torch.float32),
        torch.arange(w, device=images.device, dtype=torch.float32),
        indexing="ij",
    )
    xy = torch.stack([xs, ys])[None].expand(b, 2, h, w) / sigma_xy
    return torch.cat([xy, images.float() / sigma_rgb], dim=1)


def dense_energy(
    probs: Tensor,
    features: Tensor,
    kernel: str,
    roi: Tensor | None = None,
    gate: Tensor | None = None,
    block_size: int | None = None,
    box: FixedBox | None = None,
    fused: bool | None = None,
) -> Tensor:
    """Gated dense energy ``-(1/B) sum_b sum_i g_i S_i . (W S)_i`` at the given resolution.

    Args:
        probs: ``(B, K, h, w)`` probabilities ``S`` (gradient flows to them).
        features: ``(B, D, h, w)`` kernel features (:func:`bilateral_features`),
            ``W_ij = exp(-|f_i - f_j|^2 / 2)``.
        kernel: ``W S`` implementation: ``"lattice"`` (:func:`lattice_filter`) or an exact one, see
            :func:`gaussian_filter`.
        roi: ``(B, h, w)`` bool region; pixels outside take no part (as rows or columns; the lattice's points
            are the whole grid's). None = all.
        gate: ``(B, h, w)`` non-negative per-pixel weights ``g`` (treated as constants). None = 1.
        block_size: Tile edge of :func:`gaussian_filter_dense`.
        box, fused: The lattice's codes fixed in advance and its kernels (:func:`lattice_filter`).

    Returns:
        Scalar energy (negative). Its gradient w.r.t. ``probs`` is ``-(2/B) g (W S)`` inside ``roi``,
        0 outside (exact when ``g`` is uniform).
    """
    b, _, h, w = probs.shape
    if roi is None:
        roi = torch.ones(b, h, w, dtype=torch.bool, device=probs.device)
    if gate is None:
        gate = torch.ones(b, h, w, device=probs.device)
    lattice = {"box": box, "fused": fused}
    return _DenseEnergy.apply(probs, features.detach(), roi.to(torch.bool), gate.detach(), block_size, kernel, lattice)


class DenseEnergyLoss(nn.Module):
    """ToCo's gated dense energy loss (see the module docstring for the exact definition).

    Args:
        weight: Multiplier of the energy (ToCo: 1e-7). The total-loss coefficient (0.05) is applied
            by the caller.
        sigma_rgb: Colour bandwidth (0..255 scale).
        sigma_xy: Spatial bandwidth in pixels of the full-resolution input.
        scale_factor: Resolution of the evaluation relative to the input.
        ignore_index: Pseudo-label value of unlabelled pixels (gate 1).
        kernel: ``W S`` implementation: ``"auto"`` (fused Triton kernel on CUDA, blocked elsewhere),
            ``"fused"`` or ``"blocked"`` (:func:`gaussian_filter`), or ``"lattice"`` (the reference's,
            :func:`lattice_filter`; on CUDA its codes fixed from the crop's size and the colours 0..255, so that a
            CUDA graph can capture it).
        block_size: Tile edge of the blocked evaluation; None picks :func:`default_block_size`.
        lattice_kernels: The lattice's Triton kernels and codes fixed in advance, the GPU's path; None: on CUDA where
            triton is installed (its codes fixed on CUDA either way); True runs that path on a CPU too, in Triton's
            interpreter (``bench/op_counts.py`` counts a GPU's operations so).
    """

    def __init__(
        self,
        weight: float,
        sigma_rgb: float,
        sigma_xy: float,
        scale_factor: float,
        ignore_index: int,
        kernel: str,
        block_size: int | None = None,
        lattice_kernels: bool | None = None,
    ):
        super().__init__()
        self.weight = weight
        self.sigma_rgb = sigma_rgb
        self.sigma_xy = sigma_xy
        self.scale_factor = scale_factor
        self.ignore_index = ignore_index
        self.block_size = block_size
        self.kernel = kernel
        self.lattice_kernels = lattice_kernels
        self._boxes: dict[tuple, FixedBox] = {}

    @classmethod
    def from_config(cls, cfg: LossConfig, ignore_index: int) -> DenseEnergyLoss:
        """The loss with the constants of a :class:`wsss.config.LossConfig`: weight ``reg_energy_weight *
        reg_lattice_match`` for the exact kernels (the reference's strength, see the module docstring),
        ``reg_energy_weight`` for the reference's lattice."""
        match = 1.0 if cfg.reg_kernel == "lattice" else cfg.reg_lattice_match
        return cls(
            weight=cfg.reg_energy_weight * match,
            sigma_rgb=cfg.reg_sigma_rgb,
            sigma_xy=cfg.reg_sigma_xy,
            scale_factor=cfg.reg_scale,
            ignore_index=ignore_index,
            kernel=cfg.reg_kernel,
        )

    def extra_repr(self) -> str:
        return (
            f"weight={self.weight}, sigma_rgb={self.sigma_rgb}, sigma_xy={self.sigma_xy}, "
            f"scale_factor={self.scale_factor}, kernel={self.kernel!r}"
        )

    def forward(self, images: Tensor, probs: Tensor, valid_mask: Tensor | None, pseudo_label: Tensor) -> Tensor:
        """Energy loss of segmentation probabilities.

        Args:
            images: ``(B, 3, H, W)`` RGB in 0..255 (de-normalised, not ImageNet-normalised).
            probs: ``(B, C, H, W)`` softmax of the segmentation logits at the crop size.
            valid_mask: ``(B, H, W)`` bool valid crop region, or None for the whole crop.
            pseudo_label: ``(B, H, W)`` pseudo labels; ``ignore_index`` pixels get gate 1.

        Returns:
            Scalar ``weight * E`` (negative).
        """
        b, _, h, w = probs.shape
        size = (int(h * self.scale_factor), int(w * self.scale_factor))
        small_images = F.interpolate(images.float(), size=size, mode="nearest")
        small_probs = F.interpolate(probs.float(), size=size, mode="bilinear", align_corners=False)
        if valid_mask is None:
            roi = torch.ones(b, *size, dtype=torch.bool, device=probs.device)
        else:
            roi = F.interpolate(valid_mask[:, None].float(), size=size, mode="nearest")[:, 0] > 0.5
        label = F.interpolate(pseudo_label[:, None].float(), size=size, mode="nearest")[:, 0]
        gate = (1.0 - small_probs.detach().amax(dim=1)).clamp(min=0)
        gate = torch.where(label == self.ignore_index, torch.ones_like(gate), gate)
        features = bilateral_features(small_images, self.sigma_rgb, self.sigma_xy * self.scale_factor)
        on_gpu = probs.device.type == "cuda"
        fused = self.lattice_kernels if self.lattice_kernels is not None else on_gpu and kernels is not None
        box = self._box(b, size, probs.device) if self.kernel == "lattice" and (fused or on_gpu) else None
        return self.weight * dense_energy(small_probs, features, self.kernel, roi, gate * roi, self.block_size, box,
                                          fused)  # fmt: skip

    def _box(self, images: int, size: tuple[int, int], device: torch.device) -> FixedBox:
        """The lattice codes of ``images`` crops of ``size`` (made once each: the first, eager iteration uploads
        its constants, a captured one reuses them): :func:`bilateral_features`' range, colours in
        :data:`RGB_RANGE`, positions :data:`BOX_MARGIN_PIXELS` past the crop's."""
        key = (images, size, device)
        if key not in self._boxes:
            xy, margin = self.sigma_xy * self.scale_factor, BOX_MARGIN_PIXELS
            low = [-margin / xy] * 2 + [RGB_RANGE[0] / self.sigma_rgb] * 3
            high = [(size[1] - 1 + margin) / xy, (size[0] - 1 + margin) / xy] + [RGB_RANGE[1] / self.sigma_rgb] * 3
            self._boxes[key] = fixed_box(low, high, images, device)
        return self._boxes[key]
