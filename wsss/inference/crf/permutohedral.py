"""The permutohedral lattice (Adams, Baek & Davis 2010) in PyTorch: Gaussian filtering of values over feature space.

This is the lattice of Krähenbühl & Koltun's dense CRF as pydensecrf builds it (``permutohedral.cpp``), with its
constants and its order of operations, so that the same float32 features give the same lattice points and the same
barycentric weights:

- **elevation**: feature ``f`` (d values, already divided by the kernel's standard deviations) is scaled by
  ``sqrt(2/3) (d+1) / sqrt((i+1)(i+2))`` per coordinate and lifted onto the hyperplane ``sum = 0`` of
  ``R^(d+1)``;
- **enclosing simplex**: the nearest remainder-0 lattice point by rounding each coordinate divided by ``d+1`` (ties
  to even), the coordinates ranked, and the point brought back onto the plane;
- **barycentric weights** of the d+1 simplex vertices, the vertices' integer keys (d coordinates; the last is
  redundant) from the canonical simplex;
- **lattice points** are the distinct keys: each image of a batch has its own (the image index is one more key
  coordinate), found exactly (no two keys can collide) through a table over every cell of the keys' ranges where it
  is small (pixel positions), else by sorting integer codes, instead of pydensecrf's hash table; pixel positions'
  points are numbered in the order that hash table inserts them (the first pixel reaching each), colour keys' in
  the order of their codes, whichever keeps the products local (:func:`_index_vertices`);
- **filtering**: splat (each value spread to its d+1 vertices with its barycentric weights), blur along each of the
  d+1 lattice directions with the kernel ``[1/2, 1, 1/2]`` (a missing neighbour counts as 0), slice (gather back
  with the same weights), scaled by ``alpha = 1 / (1 + 2^-d)``.

Splat, blur and slice are sparse matrix products (CSR), built once per lattice, so a mean-field iteration is a few
sparse-dense products on whatever device the features are on, each into a buffer made once (:meth:`Lattice.filter`),
and the sums are deterministic; :meth:`Lattice.filter_fused` runs each as one Triton kernel
(:mod:`wsss.inference.crf.kernels`, the default on CUDA).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from wsss.utils.tensors import to_device

try:  # optional: triton ships with the CUDA builds of torch (Lattice.filter_fused)
    from wsss.inference.crf import kernels
except ModuleNotFoundError as err:  # pragma: no cover - depends on the install
    if err.name != "triton":
        raise
    kernels = None

__all__ = ["FixedBox", "Lattice", "build_lattice", "filter_pair_fused", "fixed_box", "pair_workspace", "workspace_for"]

_CODE_BITS = 62
"""Keys pack into one int64 code when their coordinate ranges span fewer than 2 ** this many cells (else rows are
sorted)."""
_DENSE_CELLS_PER_ENTRY = 4
"""Keys are numbered through a table over every cell of their ranges when it has at most this many cells per entry
(a 2-d lattice of pixel positions: about 3; colour keys have far more): a scatter and gathers instead of a sort and
a binary search. The table holds one int64 per cell."""


@dataclass
class Lattice:
    """A permutohedral lattice over N points (of one or many images), ready to filter (N, C) values.

    Attributes:
        splat: (M, N) CSR matrix: lattice point <- point, the barycentric weights.
        slice: (N, M) CSR matrix: point <- lattice point, the barycentric weights times ``alpha``.
        blur: d+1 (M+1, M+1) CSR matrices ``I + (P_-1 + P_+1) / 2``, one per lattice direction, applied in order;
            none where the lattice was built for the kernels (``neighbours``).
        points: M, the number of lattice points.
        neighbours: (d+1, 2, M) integers (int32 where M < 2^31; each row contiguous) where built for the kernels
            (``build_lattice(fused=True)``), else None: each direction's first and second neighbour + 1 of every
            lattice point (0: absent), which the blur kernel reads instead of a matrix.
        live: Where a fixed box made the lattice (``build_lattice(box=...)``): a (1,) integer tensor on the device,
            the number of real points, which come first; the kernels' splat and blur stop at them (the empty
            points after them are nobody's neighbour and never sliced). Else None: every point is real.
        blur_directions: The lattice directions the kernels blur in one launch (``infer.crf.blur_directions``, 1 to
            :data:`wsss.config.schema.CRF_BLUR_DIRECTIONS`): the same float32 sums however many.
    """

    splat: Tensor
    slice: Tensor
    blur: list[Tensor]
    points: int
    neighbours: Tensor | None = None
    live: Tensor | None = None
    blur_directions: int = 1

    def filter(self, values: Tensor, add_to: Tensor | None = None, workspace: Tensor | None = None) -> Tensor:
        """(N, C) values of the lattice's dtype -> (N, C) Gaussian-filtered values (``Permutohedral::compute``),
        added in place to ``add_to`` (N, C) when given (one pass over the output fewer).

        ``workspace``: a (2, R, C) tensor with R >= ``points`` + 1 that holds the lattice's values between products
        (:func:`workspace_for`), reused by every call: each product writes into it in place (``addmm_``, ``beta=0``)
        instead of into a fresh tensor, whose pages the CPU would fault in at every product (a fresh 100 MB
        costs 40 ms on one core; the 81-class Gaussian filter of a 640 x 480 image took 259 ms against 79)."""
        if self.neighbours is not None:
            raise RuntimeError("this lattice was built for the Triton kernels (fused=True): use filter_fused")
        if workspace is None:
            workspace = workspace_for([self], values.shape[1], values.dtype, values.device)
        current, spare = workspace[0, : self.points + 1], workspace[1, : self.points + 1]
        current.addmm_(self.splat, values, beta=0)
        for blur in self.blur:
            spare.addmm_(blur, current, beta=0)
            current, spare = spare, current
        if add_to is None:
            add_to = values.new_zeros(values.shape)
        return add_to.addmm_(self.slice, current)

    def filter_fused(self, values: Tensor, out: Tensor, workspace: Tensor, base: Tensor | None = None,
                     softmax: bool = False, groups: int = 1) -> Tensor:  # fmt: skip
        """:meth:`filter` in Triton kernels (:func:`wsss.inference.crf.kernels.product` and
        :func:`~wsss.inference.crf.kernels.blur`, float32, contiguous (N, C) blocks) on a lattice built for them
        (``fused=True``): ``out = base + filter(values)``, each row replaced by its softmax with ``softmax`` (of each
        of ``groups`` equal groups of its channels); ``d + 3`` launches."""
        current = self.spread_fused(values, (workspace[0], workspace[1]))
        return kernels.product(self.slice, current, out, base=base, softmax=softmax, groups=groups)

    def spread_fused(self, values: Tensor, buffers: tuple[Tensor, Tensor]) -> Tensor:
        """The splat and the blurs of :meth:`filter_fused`: the (``points`` + 1, C) lattice values to slice, in the
        first of ``buffers`` (two (R, C) float32 blocks, R > ``points``, the second used between the blurs)."""
        if self.neighbours is None:
            raise RuntimeError("filter_fused needs a lattice built for the Triton kernels: build_lattice(fused=True)")
        step = self.blur_directions
        launches = [self.neighbours[j : j + step] for j in range(0, len(self.neighbours), step)]
        current, spare = buffers if len(launches) % 2 == 0 else buffers[::-1]  # the last blur's into the first
        current, spare = current[: self.points + 1], spare[: self.points + 1]
        kernels.product(self.splat, values, current, live=self.live)
        for neighbours in launches:
            kernels.blur(neighbours, current, spare, live=self.live)
            current, spare = spare, current
        return current

    def scaled(self, outer: Tensor, inner: Tensor) -> Lattice:
        """The lattice whose :meth:`filter` gives ``outer * filter(inner * values)`` for (N, 1) ``outer`` and
        ``inner``: the per-point factors folded into the slice's and the splat's weights (a kernel's normalisation
        and weight cost no pass over the values)."""
        return replace(self, splat=_scale(self.splat, inner[:, 0], rows=False), slice=_scale(self.slice, outer[:, 0]))


@dataclass(frozen=True)
class FixedBox:
    """The integer codes of a lattice's keys fixed in advance from bounds on its features (:func:`fixed_box`), so
    that :func:`build_lattice` reads nothing back from the device and its shapes depend on the number of points
    alone: a CUDA graph can capture it. Its tensors are on the features' device, uploaded once when it is made (an
    upload inside a capture would replay a host buffer that is gone by then).

    Attributes:
        scales: (d,) float32 elevation factors (:func:`_elevation_scales`).
        low: (d,) int64, the lowest key of each column the codes count from.
        strides: (d,) int64 code strides of the key columns.
        steps: (d+1,) int64 code shifts to each direction's first neighbour.
        span: Codes per image.
        images: Images per lattice.
        total: The sum of the strides.
        reach: The largest code shift to a neighbour.
        past: A code past every code of the box and every neighbour's, the empty points' (:func:`_index_vertices`).
        bounds: (2, d) float32, the lowest and highest features it was made for.
    """

    scales: Tensor
    low: Tensor
    strides: Tensor
    steps: Tensor
    span: int
    images: int
    total: int
    reach: int
    past: int
    bounds: Tensor


def fixed_box(low: Sequence[float], high: Sequence[float], images: int, device: torch.device | str) -> FixedBox:
    """The :class:`FixedBox` of the lattices of ``images`` images whose features lie within ``low`` .. ``high``
    (d values each, feature units: already divided by the standard deviations) on ``device``.

    The box is :func:`_code_box`'s for the range of remainder-0 points those features can have
    (:func:`_remainder_range`). A feature outside the bounds would give a wrong lattice: the caller keeps its
    features within them.
    """
    d = len(low)
    if len(high) != d or any(lo > hi for lo, hi in zip(low, high, strict=True)):
        raise ValueError(f"feature bounds must be two sequences of d values, low <= high: got {low}, {high}")
    ranges = _remainder_range(low, high)
    low_keys, strides, span = _box_from_range(*zip(*ranges, strict=True))
    reach = max(abs(s) for s in _code_steps(strides))
    if span * images + 2 * reach >= 2**_CODE_BITS:
        raise ValueError(f"feature bounds {low} .. {high} span too many lattice keys for one int64 code: a lattice "
                         "fixed in advance needs narrower bounds (or larger standard deviations)")  # fmt: skip
    device = torch.device(device)
    return FixedBox(
        scales=torch.tensor(_elevation_scales(d), dtype=torch.float32).to(device),
        low=torch.tensor(low_keys).to(device),
        strides=torch.tensor(strides).to(device),
        steps=torch.tensor(_code_steps(strides)).to(device),
        span=span,
        images=images,
        total=sum(strides),
        reach=reach,
        past=span * images + reach,
        bounds=torch.tensor([list(low), list(high)], dtype=torch.float32).to(device),
    )


def _remainder_range(low: Sequence[float], high: Sequence[float]) -> list[tuple[int, int]]:
    """The lowest and highest remainder-0 coordinate (:func:`_enclosing_simplex`) of each of the first d columns for
    features within ``low`` .. ``high``: each elevated coordinate is a linear map of the features (:func:`_elevate`),
    so its range follows from theirs, plus 1 for float32 rounding; a remainder-0 coordinate lies within 3(d+1)/2
    of its elevated one (the rounding to a multiple of d+1, then the wrap)."""
    d = len(low)
    scales = _elevation_scales(d)
    margin = 1.0 + 1.5 * (d + 1)
    ranges = []
    for j in range(d):  # elevated[0] = sum_i c_i, elevated[j] = sum_{i > j} c_i - j c_j, c_i = scales[i-1] f[i-1]
        coefficients = [scales[i - 1] * (1.0 if i > j else -float(j) if i == j else 0.0) for i in range(1, d + 1)]
        terms = [sorted((c * lo, c * hi)) for c, lo, hi in zip(coefficients, low, high, strict=True)]
        ranges.append((math.floor(sum(t[0] for t in terms) - margin), math.ceil(sum(t[1] for t in terms) + margin)))
    return ranges


def build_lattice(
    features: Tensor,
    sizes: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    reference_padding: bool = False,
    fused: bool = False,
    box: FixedBox | None = None,
    blur_directions: int = 1,
    simplices_kernel: bool = False,
) -> Lattice:
    """The lattice of ``features``, one separate lattice per image when ``sizes`` gives more than one.

    Args:
        features: (N, d) float32 positions in feature space, already divided by the standard deviations.
        sizes: The number of points of each image, whose points follow each other in ``features`` (sum N), or None
            for one image. Points of different images never share a lattice point, so one call filters many images
            independently. Host integers: the image of each point and the padding below need no read of the
            device.
        dtype: Of the filter's weights, and so of the values it filters (the lattice itself is found in float32,
            as pydensecrf finds it).
        reference_padding: Add the lattice points that pydensecrf's SSE build adds: it places the points in groups
            of four, and pads the last group of an image whose N is not a multiple of 4 with points at feature 0.
            They splat nothing and are never sliced, but their simplex's vertices join the lattice and relay the
            blur between the real vertices around them (marginals move by up to 8e-3 on random colours).
        fused: Build the lattice for the Triton kernels (:meth:`Lattice.filter_fused`): elevate the features and
            find their simplices and weights in one kernel (:func:`wsss.inference.crf.kernels.simplices`, the same
            float32 roundings) instead of about 80 PyTorch operations, and keep the blur's neighbours as they are
            (``Lattice.neighbours``, read by :func:`~wsss.inference.crf.kernels.blur`) instead of making a matrix
            of them per direction.
        box: Codes fixed in advance (:func:`fixed_box`, for ``len(sizes)`` images of equal size whose features lie
            within its bounds), or None: the codes' box from the features' range (read back from the device). With a
            box nothing is read back and every shape depends on N alone: the lattice keeps N (d+1) points, the M
            real ones numbered as without a box, then empty ones (no entry, no neighbour), which filter to the same
            values.
        blur_directions: With ``fused``, the directions blurred per launch (:attr:`Lattice.blur_directions`).
        simplices_kernel: Find the simplices and weights in the Triton kernel as ``fused`` does, the products'
            matrices as without it (PyTorch's): the same lattice in 2 operations instead of about 80.

    Returns:
        The :class:`Lattice`, on the device of ``features``.
    """
    if features.ndim != 2 or features.dtype != torch.float32:
        raise ValueError(f"features must be (N, d) float32, got {tuple(features.shape)} {features.dtype}")
    n, d = features.shape
    device = features.device
    sizes = [n] if sizes is None else [int(k) for k in sizes]
    if sum(sizes) != n:
        raise ValueError(f"the images' sizes {sizes} do not add up to the {n} points of the features")
    padded = [k for k, points in enumerate(sizes) if points % 4] if reference_padding else []
    if padded:
        features = torch.cat([features, features.new_zeros(len(padded), d)])
    if box is not None and (box.images != len(sizes) or len(set(sizes)) > 1 or box.scales.numel() != d):
        raise ValueError(f"a fixed box of {box.images} images of {box.scales.numel()}-d features cannot take "
                         f"images of {sizes} points of {d}-d features")  # fmt: skip
    segments = None
    if len(sizes) > 1 and len(set(sizes)) == 1:  # each point's image, the padding's after: nothing uploaded
        segments = torch.arange(n, device=device).div_(sizes[0], rounding_mode="floor")
        segments = torch.cat([segments, torch.arange(len(padded), device=device)])  # all images padded, or none
    elif len(sizes) > 1:
        ends = to_device(torch.tensor(sizes).cumsum(0), device)
        segments = torch.searchsorted(ends, torch.arange(n, device=device), right=True)
        segments = torch.cat([segments, to_device(torch.tensor(padded, dtype=torch.long), device)])
    if fused or simplices_kernel:
        scales = box.scales if box is not None else to_device(torch.tensor(_elevation_scales(d)), device)
        rem0, rank, weights = kernels.simplices(features, scales, _down(d))
    else:
        elevated = _elevate(features)
        rem0, rank = _enclosing_simplex(elevated)
        weights = _barycentric(elevated, rem0, rank)
    vertex, neighbours, m, order, live = _index_vertices(rem0, rank, segments, len(sizes), box)
    # Lattice values carry one extra row 0 (pydensecrf's "-1 -> 0" shift): what a missing neighbour reads
    size = m + 1
    vertex = vertex[: n * (d + 1)]  # the padding points' entries follow: they splat nothing
    if order is None:  # the entries by point, in order
        order = torch.sort(vertex.int() if vertex.numel() < 2**31 else vertex, stable=True).indices
    elif order.numel() > vertex.numel():  # the real points' entries in their order, a count the host knows: each
        keep = order < vertex.numel()  # to its place among them, the padding's to one slot past them (no host read)
        slot = torch.where(keep, keep.cumsum(0) - 1, vertex.numel())
        order = order.new_empty(vertex.numel() + 1).scatter_(0, slot, order)[:-1]
    counts = torch.zeros(size, dtype=torch.long, device=device)  # row 0 (the missing neighbours' zeros) has none
    counts[1:].scatter_add_(0, vertex, counts.new_ones(1).expand(vertex.numel()))
    splat = _csr(_crow(counts), order // (d + 1), weights.take(order), (size, n), dtype)
    by_entry = (vertex + 1).view(n, d + 1)
    weights = weights[:n]
    cols, sort = by_entry.sort(dim=1)  # CSR columns ascend within a row
    alpha = np.float32(1.0 / (1.0 + 2.0 ** (-d)))
    slice_ = _csr(torch.arange(n + 1, device=device) * (d + 1), cols.reshape(-1),
                  weights.view(n, d + 1).gather(1, sort).reshape(-1) * float(alpha), (n, size), dtype)  # fmt: skip
    if fused:  # (d+1, 2, M)
        return Lattice(splat=splat, slice=slice_, blur=[], points=m, neighbours=neighbours, live=live,
                       blur_directions=blur_directions)  # fmt: skip
    index = torch.int32 if 3 * size < 2**31 else torch.long  # as _csr keeps it
    own = torch.arange(1, size, dtype=index, device=device)
    crow = (torch.arange(size + 1, dtype=index, device=device) - 1).clamp_(min=0) * 3  # row 0 has no entry
    # every direction's rows at once (a few operations per lattice, not per direction): each row's three columns in
    # ascending order, the point and its two neighbours (a missing one, 0, reads row 0: it adds 0 exactly)
    low, high = neighbours.amin(dim=1), neighbours.amax(dim=1)  # (d+1, M)
    cols = torch.empty(d + 1, m, 3, dtype=index, device=device)
    torch.minimum(own, low, out=cols[:, :, 0])
    torch.clamp(own, low, high, out=cols[:, :, 1])  # the middle of three where low <= high
    torch.maximum(own, high, out=cols[:, :, 2])
    del low, high
    values = torch.where(cols == own[:, None], 1.0, 0.5).to(dtype)
    blur = [_csr(crow, c.view(-1), v.view(-1), (size, size), dtype) for c, v in zip(cols, values, strict=True)]
    return Lattice(splat=splat, slice=slice_, blur=blur, points=m, live=live)


def workspace_for(lattices: list[Lattice], columns: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The (2, R, ``columns``) workspace of :meth:`Lattice.filter` for any of ``lattices`` (R: the most lattice
    values of one), zeros: it then only ever holds finite values, so a product with ``beta=0`` is right even on a
    sparse backend that would read its output (MKL does not: a workspace of NaN gives the same, tested)."""
    return torch.zeros(2, max(lattice.points for lattice in lattices) + 1, columns, dtype=dtype, device=device)


def filter_pair_fused(lattices: tuple[Lattice, Lattice], values: Tensor, out: Tensor, workspace: Tensor,
                      base: Tensor, softmax: bool = False, groups: int = 1) -> Tensor:  # fmt: skip
    """``out = (base + lattices[0].filter(values)) + lattices[1].filter(values)``, each row replaced by its softmax
    with ``softmax`` (as :meth:`Lattice.filter_fused`), both slices in one launch: the same float32 sums as the two
    :meth:`~Lattice.filter_fused` calls one after the other, with ``base`` read and ``out`` written once (the
    mean-field's message is never stored). ``workspace``: :func:`pair_workspace`'s; ``d_0 + d_1 + 5`` launches."""
    order, _ = _pair_layout(lattices)
    held, rows = lattices[order[0]].points + 1, lattices[order[1]].points + 1
    spread = {order[0]: lattices[order[0]].spread_fused(values, (workspace[:held], workspace[held : 2 * held]))}
    buffers = (workspace[held : held + rows], workspace[held + rows : held + 2 * rows])
    spread[order[1]] = lattices[order[1]].spread_fused(values, buffers)  # the first's values kept in rows :held
    return kernels.product(lattices[0].slice, spread[0], out, base=base, softmax=softmax, groups=groups,
                           second=(lattices[1].slice, spread[1]))  # fmt: skip


def pair_workspace(lattices: tuple[Lattice, Lattice], columns: int, dtype: torch.dtype,
                   device: torch.device) -> Tensor:  # fmt: skip
    """The (R, ``columns``) workspace of :func:`filter_pair_fused`: one lattice's values held while the other is
    splatted and blurred in two buffers of its own, the lattices spread in the order that needs fewer rows (with
    many more colour points than positions, about as many rows as :func:`workspace_for`'s two buffers)."""
    return torch.zeros(_pair_layout(lattices)[1], columns, dtype=dtype, device=device)


def _pair_layout(lattices: tuple[Lattice, Lattice]) -> tuple[tuple[int, int], int]:
    """The order :func:`filter_pair_fused` spreads ``lattices`` in, and the rows of its workspace: the first's
    values (points + 1 rows) then two buffers of the second's, or of the first's while it is spread."""
    rows = [lattice.points + 1 for lattice in lattices]
    layouts = [((i, 1 - i), rows[i] + max(rows[i], 2 * rows[1 - i])) for i in (0, 1)]
    return min(layouts, key=lambda layout: layout[1])


def _elevation_scales(d: int) -> list[float]:
    """The float32 factor of each feature column j - 1 (j = 1..d) before its elevation, as pydensecrf's."""
    inv_std_dev = np.float32(math.sqrt(2.0 / 3.0) * (d + 1))
    return [float(np.float32(1.0 / math.sqrt((j + 1) * j) * float(inv_std_dev))) for j in range(1, d + 1)]


def _down(d: int) -> float:
    """``1 / (d + 1)`` in float32, as pydensecrf's."""
    return float(np.float32(1.0) / np.float32(d + 1))


def _elevate(features: Tensor) -> Tensor:
    """(N, d) -> (N, d+1) coordinates on the plane sum = 0, in float32 as pydensecrf computes them."""
    n, d = features.shape
    scales = _elevation_scales(d)
    elevated = features.new_empty(n, d + 1)
    sm = features.new_zeros(n)
    for j in range(d, 0, -1):
        cf = features[:, j - 1] * scales[j - 1]
        elevated[:, j] = sm - cf * float(j)
        sm = sm + cf
    elevated[:, 0] = sm
    return elevated


def _enclosing_simplex(elevated: Tensor) -> tuple[Tensor, Tensor]:
    """The remainder-0 point ``rem0`` (N, d+1) int64 and the rank (N, d+1) int64 of each coordinate's remainder."""
    d = elevated.shape[1] - 1
    down = _down(d)
    v = torch.round(elevated * down)  # ties to even, as the SSE conversion in the reference
    rem0 = v * float(d + 1)
    total = v.sum(dim=1, keepdim=True)  # integers: exact in any order
    diff = elevated - rem0
    # a coordinate's rank counts the later coordinates whose remainder is above its own and the earlier ones at or
    # above it (a tie ranks the later coordinate higher), one column j at a time: no (N, d+1, d+1) comparison
    rank = torch.zeros_like(diff, dtype=torch.uint8)
    for j in range(d + 1):
        column = diff[:, j : j + 1]
        rank[:, :j] += column > diff[:, :j]
        rank[:, j + 1 :] += column >= diff[:, j + 1 :]
    rank = rank.long() + total.long()
    wrap = (rank < 0).long() - (rank > d).long()
    rank = rank + (d + 1) * wrap
    rem0 = rem0.long() + (d + 1) * wrap
    return rem0, rank


def _barycentric(elevated: Tensor, rem0: Tensor, rank: Tensor) -> Tensor:
    """(N, d+1) float32 weights of the simplex vertices 0..d (each row sums to 1)."""
    d = elevated.shape[1] - 1
    down = _down(d)
    v = (elevated - rem0.float()) * down
    by_slot = torch.zeros_like(v).scatter_(1, d - rank, v)  # by_slot[:, p] = v of the coordinate ranked d - p
    weights = torch.empty_like(v)
    weights[:, 1:] = by_slot[:, 1:] - by_slot[:, :-1]  # slot p gets +v of rank d-p and -v of rank d-p+1
    weights[:, 0] = by_slot[:, 0] + (1.0 - by_slot[:, d])  # slot d+1 (-v of rank 0) wraps around into slot 0
    return weights


def _index_vertices(
    rem0: Tensor, rank: Tensor, segments: Tensor | None, images: int = 1, box: FixedBox | None = None
) -> tuple[Tensor, Tensor, int, Tensor | None, Tensor | None]:
    """Number the simplex vertices of every point: the lattice points.

    The vertex r of point i has the key ``rem0[i, :d] + r - (d+1) [rank[i, :d] > d - r]`` (the canonical simplex's
    vertex r is (r, ..., r, r - (d+1), ..., r - (d+1)) with d+1-r leading r's, in the order of the ranks), the
    image index (``segments``, 0 to ``images`` - 1) before it. The numbering keeps the products local, measured on
    the CPU on bench/bench_crf.py's photographs:

    - keys of pixel positions (found through a table over every cell) are numbered in the order pydensecrf's hash
      table inserts them: by the first entry (point, vertex) that reaches them, so points near in the image are near
      in memory: the Gaussian kernel's splat and slice products ran 2.4x and 3.8x faster than in key order;
    - keys with colours (found by sorting their codes) in the order of their codes: the bilateral kernel's filter ran
      117 -> 89 ms (81 classes, 640 x 480, median of 9) against the insertion order, and the build needs no
      renumbering and no sort of the entries by point (the stable sort of the codes gives it).

    With a fixed ``box`` the codes are its own and sorted, and the M real points are followed by empty ones up to L,
    so that nothing is read back from the device.

    Returns ``vertex`` (L,) with L = N (d+1): the lattice point (0..M-1) of each entry, point-major; (d+1, 2, M):
    for each direction the indices + 1 of every lattice point's first and second neighbour (0 where absent,
    :func:`_with_second_neighbours`); M (L with a box); the entries in the order of their points (stable), or
    None where the numbering gives it no faster than a sort of ``vertex``; and with a box the number of real points,
    a (1,) tensor on the device (:attr:`Lattice.live`), else None.
    """
    n, d = rem0.shape[0], rem0.shape[1] - 1
    device = rem0.device
    entries = torch.arange(n * (d + 1), device=device)
    if box is None:
        low, strides, span = _code_box(rem0)
        if span * images >= 2**_CODE_BITS:  # too wide for one int64 code: sort the key rows themselves
            vertex, n1, m = _index_rows(_keys(rem0, rank, segments), d, offset=0 if segments is None else 1)
            return vertex, _with_second_neighbours(n1, m), m, None, None
        low, stride = to_device(torch.tensor(low), device), to_device(torch.tensor(strides), device)
        steps = to_device(torch.tensor(_code_steps(strides)), device)
        reach, total = max(abs(s) for s in _code_steps(strides)), sum(strides)
    else:
        low, stride, steps, span, reach, total = box.low, box.strides, box.steps, box.span, box.reach, box.total
    cells = span * images
    base = ((rem0[:, :d] - low) * stride).sum(dim=1)
    if segments is not None:
        base += segments.to(device).long() * span
    # code(i, r) = base(i) + r sum(stride) - (d+1) T(i, d+1-r), T(i, k) the strides of the columns ranked >= k
    by_rank = torch.zeros(n, d + 2, dtype=torch.long, device=device).scatter_(1, rank[:, :d], stride.expand(n, d))
    above = by_rank.flip(1).cumsum_(1)[:, : d + 1]  # above[:, r] = T(i, d+1-r) (rank d+1 holds nothing)
    r = torch.arange(d + 1, device=device)
    codes = above.mul_(-(d + 1)).add_(base[:, None]).add_(r * total).reshape(-1)
    if box is None and cells <= _DENSE_CELLS_PER_ENTRY * entries.numel():  # a table over every cell, no sort
        first = torch.full((cells,), entries.numel(), device=device).scatter_reduce_(0, codes, entries, "amin")
        points = (first < entries.numel()).nonzero()[:, 0]
        points = points.take(torch.argsort(first.take(points)))  # insertion order
        m = points.numel()
        table = first.zero_()
        table[points] = torch.arange(1, m + 1, device=device)
        vertex = table.take(codes) - 1
        n1 = table.take(points[None, :] + steps[:, None])  # (d+1, M); margins keep every shift in the table
        order = live = None
    else:
        past = cells + reach if box is None else box.past  # past every code and every code's neighbour
        if past + reach < 2**31:  # int32 sorts in half the time
            codes, steps = codes.int(), steps.int()
        sorted_codes, order = torch.sort(codes, stable=True)
        first = torch.ones_like(sorted_codes, dtype=torch.bool)
        first[1:] = sorted_codes[1:] != sorted_codes[:-1]
        point = torch.cumsum(first, 0).sub_(1)
        if box is None:
            unique, live = sorted_codes[first], None
        else:  # every code to its point's slot, the empty points' slots past all of them: still sorted
            unique = torch.full_like(sorted_codes, past).scatter_(0, point, sorted_codes)
            live = point[-1:] + 1
        m = unique.numel()
        vertex = torch.empty_like(entries).scatter_(0, order, point)
        shifted = unique[None, :] + steps[:, None]  # rows ascend: the search walks the table in order (2.3x faster)
        found = torch.searchsorted(unique, shifted, out_int32=m < 2**31).clamp_(max=m - 1)
        hit = unique.index_select(0, found.view(-1)).view_as(found) == shifted  # index_select: int32 as it is
        del shifted
        n1 = found.add_(1).mul_(hit)  # 0: absent
    return vertex, _with_second_neighbours(n1, m), m, order, live


def _with_second_neighbours(n1: Tensor, m: int) -> Tensor:
    """(d+1, 2, M): each direction's first and second neighbours + 1 of the M lattice points (int32 where M < 2^31),
    from the first ones (d+1, M): the second neighbour is the opposite shift, so q = n1(p) <=> p = n2(q) (a scatter
    instead of a second search). A view of a (d+1, 2, M+1) tensor (rows contiguous) whose column 0 took the absent
    ones' writes: made in place, no copy to stack them."""
    both = torch.zeros(n1.shape[0], 2, m + 1, dtype=torch.int32 if m < 2**31 else torch.long, device=n1.device)
    both[:, 0, 1:] = n1
    points = torch.arange(1, m + 1, dtype=both.dtype, device=n1.device).expand(n1.shape[0], m)
    both[:, 1].scatter_(1, both[:, 0, 1:], points)
    return both[:, :, 1:]


def _code_steps(strides: list[int]) -> list[int]:
    """The code shift to each direction's first neighbour (every column -1, column j +d; the last direction: every
    column -1)."""
    d = len(strides)
    return [(d + 1) * s - sum(strides) for s in [*strides, 0]]


def _code_box(rem0: Tensor) -> tuple[list[int], list[int], int]:
    """The integer code ``sum_j (key_j - low_j) s_j`` of the keys of every vertex and its neighbours: ``low`` (d,),
    the strides ``s`` and the number of codes (:func:`_box_from_range` of the remainder-0 points' range, read back
    from the device)."""
    d = rem0.shape[1] - 1
    lowest, highest = torch.aminmax(rem0[:, :d], dim=0)
    return _box_from_range(*torch.stack([lowest, highest]).tolist())


def _box_from_range(lowest: Sequence[int], highest: Sequence[int]) -> tuple[list[int], list[int], int]:
    """:func:`_code_box` of remainder-0 points whose column j lies within ``lowest[j]`` .. ``highest[j]``.

    The box: a vertex column is rem0 - d .. rem0 + d (r - (d+1) >= -d for r >= 1), a neighbour's one further d
    either way. The code counts steps of d+1 per column, as every column of a key has the same remainder modulo d+1
    (the vertex's r; rem0 is a multiple of d+1): with ``low`` a multiple of d+1 and ``k_j = (key_j - low_j) //
    (d+1)``, the code is ``(d+1) K + r S``, K the mixed-radix number of the k_j and ``S = sum_j s_j``. The last
    column's radix is a multiple of d+1, so ``S = 1`` modulo d+1 and no two keys share a code; the codes span
    (d+1)^(1-d) of the key box's cells (5-d colour keys of a photograph: about 2^28 against 2^38, so they sort as
    int32)."""
    d = len(lowest)
    low = [(int(v) - 2 * d) // (d + 1) * (d + 1) for v in lowest]
    radix = [(int(v) + 2 * d - lo) // (d + 1) + 1 for v, lo in zip(highest, low, strict=True)]
    radix[-1] = -(-radix[-1] // (d + 1)) * (d + 1)
    strides = [math.prod(radix[i + 1 :]) for i in range(d)]
    return low, strides, sum(((d + 1) * k - 1) * s for k, s in zip(radix, strides, strict=True)) + 1


def _keys(rem0: Tensor, rank: Tensor, segments: Tensor | None) -> Tensor:
    """(L, k) integer keys of every entry (:func:`_index_vertices`), the image index first when ``segments``."""
    d = rem0.shape[1] - 1
    r = torch.arange(d + 1, device=rem0.device)
    keys = rem0[:, None, :d] + r[None, :, None] - (d + 1) * (rank[:, None, :d] > (d - r)[None, :, None]).long()
    keys = keys.reshape(-1, d)
    if segments is not None:
        keys = torch.cat([segments.to(rem0.device).long().repeat_interleave(d + 1)[:, None], keys], dim=1)
    return keys


def _index_rows(keys: Tensor, d: int, offset: int) -> tuple[Tensor, Tensor, int]:
    """:func:`_index_vertices` by sorting the (L, k) key rows (keys too wide for one int64 code), numbered in key
    order: ``vertex``, the first neighbours (d+1, M) and M. Key columns from ``offset`` on are lattice coordinates;
    earlier ones (the image index) stay fixed in the blur."""
    steps = torch.full((d + 1, keys.shape[1]), -1, dtype=torch.long)  # to each direction's first neighbour
    steps[:, :offset] = 0
    steps[range(d), range(offset, offset + d)] = d
    unique, vertex = torch.unique(keys, dim=0, return_inverse=True)
    m = unique.shape[0]
    shifted = (unique[None] + steps.to(keys.device)[:, None, :]).reshape(-1, keys.shape[1])
    both, which = torch.unique(torch.cat([unique, shifted]), dim=0, return_inverse=True)
    table = torch.zeros(both.shape[0], dtype=torch.long, device=keys.device)
    table[which[:m]] = torch.arange(1, m + 1, device=keys.device)
    return vertex, table[which[m:]].view(d + 1, m), m


def _scale(matrix: Tensor, factors: Tensor, rows: bool = True) -> Tensor:
    """The CSR ``matrix`` with each row (else each column) multiplied by its entry of ``factors``."""
    crow, col = matrix.crow_indices(), matrix.col_indices()
    if rows:
        factors = factors.repeat_interleave(crow[1:] - crow[:-1], output_size=col.numel())
    else:
        factors = factors[col]
    return torch.sparse_csr_tensor(crow, col, matrix.values() * factors, matrix.shape, check_invariants=False)


def _crow(counts: Tensor) -> Tensor:
    """CSR row offsets from the number of entries of each row."""
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=crow[1:])
    return crow


def _csr(crow: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """A CSR matrix from its row offsets and the entries' columns and values, row by row; int32 indices where they
    fit (MKL takes no others: int64 ones are converted at every product)."""
    if cols.numel() < 2**31 and max(size) < 2**31:
        crow, cols = crow.int(), cols.int()
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values.to(dtype), size, check_invariants=False)
