"""Rank collapse of deep attention-only transformers vs. the attention offset gamma (paper Fig. 1, sec. 4.1).

Centered Self-Attention Layers (Ali, Galanti, Wolf), section 4.1: the input is ``X_1 = R_1 = I`` (n tokens of
dimension d = n), every layer is an offset self-attention

    S_gamma(X; W) = (softmax(X W_Q (X W_K)^T / sqrt(d)) + gamma 11^T / n) X W_V,

and three block types are stacked (``N`` divides every row by its L2 norm):

- ``pre_ln``:   ``X_{i+1} = S_gamma(N(X_i); W^i) + X_i``, output ``N(X_{L+1})``.
- ``post_ln``:  ``X_{i+1} = N(S_gamma(X_i; W^i) + X_i)``, output ``X_{L+1}``.
- ``residual`` (ResiDual): ``X_{i+1} = N(S_gamma(X_i; W^i) + X_i)``, ``R_{i+1} = R_i + S_gamma(X_i; W^i)``,
  output ``N(R_{L+1}) + X_{L+1}``.

Reading of the paper's formulas:

- The paper prints the Pre-LN layer as ``S_gamma(N(X_i; W^i) + X_i)``. ``N`` has no weights and a Pre-LN
  block adds the residual outside the sublayer, so the misplaced parenthesis is read as
  ``S_gamma(N(X_i); W^i) + X_i``. (The literal reading has no residual path at all.)
- Section 4.1 also writes the offset inside the softmax, where it would be a no-op (softmax is invariant to
  adding a constant to a row); the offset is added to the softmax output, as in section 3.2.

Numerics: everything runs in float64. Singular values are then accurate to ~1e-16 of the largest, so the
rank threshold 1e-3 (relative to ``||M||_F``) is far above rounding noise, and rounding errors cannot grow
into the ranks over 2000 layers. With U[0, 1] weights the logits reach a few hundred; ``torch.softmax``
subtracts the row maximum, so it neither overflows nor returns NaN (the attention is nearly one-hot). The
attention always sees row-normalised tokens, so the Pre-LN stream and the ResiDual ``R`` grow at most
linearly with depth (about 1e5 after 2000 layers here), far from overflow. ``N`` clamps row norms at 1e-300
so that an all-zero row stays zero instead of becoming NaN; a non-finite state still raises.

The same weights ``W^i`` (drawn from one generator, seeded per run) serve every gamma and every block type,
so the columns of a heatmap differ only by gamma. All gammas run as one batch. Ranks are counted with
:func:`gram_rank` (the same count as ``numerical_rank``, faster).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wsss.analysis.constants import ARCHS, INITS, RANK_THRESHOLD
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text

CSV_COLUMNS = ("arch", "init", "gamma", "depth", "rank")


def parse_gammas(spec: str) -> list[float]:
    """Gammas from ``"START:STOP:STEP"`` (STOP included when on the grid) or a comma list ``"-1,0,0.5"``.

    Values are rounded to 10 decimals so that ``-1.5:1.5:0.1`` gives exactly -1.0 and 0.0.
    """
    spec = spec.strip()
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"gamma range must be START:STOP:STEP, got {spec!r}")
        start, stop, step = (float(p) for p in parts)
        if step <= 0 or stop < start:
            raise ValueError(f"gamma range needs STEP > 0 and STOP >= START, got {spec!r}")
        count = math.floor((stop - start) / step + 1e-9) + 1
        return [round(start + k * step, 10) + 0.0 for k in range(count)]
    values = [float(v) for v in spec.split(",") if v.strip()]
    if not values:
        raise ValueError(f"no gamma values in {spec!r}")
    return values


def row_normalize(x: torch.Tensor) -> torch.Tensor:
    """``N(X)``: every row divided by its L2 norm (zero rows stay zero). (..., n, d) -> (..., n, d)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)


def offset_attention(x: torch.Tensor, gammas: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``S_gamma(X; W) = (softmax(X W_Q (X W_K)^T / sqrt(d)) + gamma 11^T / n) X W_V`` for a batch of gammas.

    Args:
        x: (G, n, d) tokens, one matrix per gamma.
        gammas: (G,) offsets.
        weights: (3, d, d) stacked ``W_Q, W_K, W_V`` shared by all gammas; None for identity weights.

    Returns:
        (G, n, d).
    """
    d = x.shape[-1]
    if weights is None:
        logits, v = x @ x.mT, x
    else:
        # X W_Q (X W_K)^T = (X (W_Q W_K^T)) X^T: one (d, d) product saves a batched matmul.
        logits, v = (x @ (weights[0] @ weights[1].mT)) @ x.mT, x @ weights[2]
    attn = torch.softmax(logits / math.sqrt(d), dim=-1)
    # (A + gamma 11^T / n) V = A V + gamma * (column means of V) on every row.
    return attn @ v + gammas.view(-1, 1, 1) * v.mean(dim=-2, keepdim=True)


def gram_rank(m: torch.Tensor, threshold: float = RANK_THRESHOLD) -> torch.Tensor:
    """:func:`~wsss.analysis.oversmoothing.numerical_rank` through the eigenvalues of the Gram matrix.

    ``sigma_i / ||M||_F > t`` iff ``lambda_i(M M^T) / tr(M M^T) > t^2``. Symmetric eigenvalues of the
    smaller Gram matrix are 2-3x faster than an SVD for 100 x 100 matrices on CPU. In float64 (used here
    whatever the input dtype) the normalised eigenvalues carry an absolute error of about 1e-14, so the
    result equals the SVD count for thresholds down to about 1e-6; for smaller thresholds use
    ``numerical_rank``.

    Args:
        m: (..., n, d) matrices.
        threshold: Relative singular-value threshold, at least 1e-6.

    Returns:
        (...,) int64 ranks.
    """
    if threshold < 1e-6:
        raise ValueError(f"gram_rank resolves thresholds >= 1e-6, got {threshold}; use numerical_rank")
    m = m.double()
    gram = m @ m.mT if m.shape[-2] <= m.shape[-1] else m.mT @ m
    eig = torch.linalg.eigvalsh(gram)
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
    return (eig > threshold**2 * trace).sum(-1)


@dataclass
class _State:
    x: torch.Tensor
    r: torch.Tensor | None = None


def _step(arch: str, state: _State, gammas: torch.Tensor, weights: torch.Tensor | None) -> _State:
    if arch == "pre_ln":
        return _State(offset_attention(row_normalize(state.x), gammas, weights) + state.x)
    s = offset_attention(state.x, gammas, weights)
    x = row_normalize(s + state.x)
    if arch == "post_ln":
        return _State(x)
    return _State(x, state.r + s)


def _output(arch: str, state: _State) -> torch.Tensor:
    if arch == "pre_ln":
        return row_normalize(state.x)
    if arch == "post_ln":
        return state.x
    return row_normalize(state.r) + state.x


def simulate_rank(
    arch: str,
    init: str,
    gammas: Sequence[float],
    depth: int,
    n: int = 100,
    d: int | None = None,
    seed: int = 0,
    threshold: float = RANK_THRESHOLD,
    on_layer: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Rank of the network output after every layer, for every gamma.

    Args:
        arch: One of :data:`ARCHS`.
        init: ``identity`` (``W_Q = W_K = W_V = I``) or ``uniform`` (i.i.d. U[0, 1], drawn per layer).
        gammas: Attention offsets.
        depth: Number of layers L.
        n: Number of tokens.
        d: Token dimension (default ``n``); the input is the (n, d) identity ``eye(n, d)``.
        seed: Seed of the weight generator (unused for ``identity``).
        threshold: Singular values of ``M / ||M||_F`` above it count towards the rank.
        on_layer: Called after every layer (progress reporting).

    Returns:
        (depth, G) int64; row ``i`` is the rank of ``f(X_1)`` with ``i + 1`` layers.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; valid: {', '.join(INITS)}")
    d = n if d is None else d
    dtype = torch.float64
    gamma_t = torch.tensor(list(gammas), dtype=dtype)
    x1 = torch.eye(n, d, dtype=dtype).expand(len(gamma_t), n, d).contiguous()
    state = _State(x1, x1.clone() if arch == "residual" else None)
    generator = torch.Generator().manual_seed(seed)
    ranks = torch.empty(depth, len(gamma_t), dtype=torch.int64)
    for i in range(depth):
        weights = None if init == "identity" else torch.rand(3, d, d, generator=generator, dtype=dtype)
        state = _step(arch, state, gamma_t, weights)
        out = _output(arch, state)
        finite = torch.isfinite(out).flatten(1).all(1)
        if not finite.all():
            bad = gamma_t[~finite].tolist()
            raise FloatingPointError(f"{arch}/{init}: non-finite output at depth {i + 1} for gammas {bad}")
        ranks[i] = gram_rank(out, threshold)
        if on_layer is not None:
            on_layer()
    return ranks


def run_grid(
    archs: Sequence[str],
    inits: Sequence[str],
    gammas: Sequence[float],
    depth: int,
    n: int = 100,
    seed: int = 0,
    threshold: float = RANK_THRESHOLD,
    progress: bool = True,
) -> dict[tuple[str, str], torch.Tensor]:
    """:func:`simulate_rank` for every (arch, init), with one tqdm bar over all layers.

    Returns:
        ``{(arch, init): (depth, G) int64 ranks}``.
    """
    from tqdm import tqdm

    results = {}
    with tqdm(total=len(archs) * len(inits) * depth, disable=not progress, unit="layer") as bar:
        for arch in archs:
            for init in inits:
                bar.set_description(f"{arch}/{init}")
                results[arch, init] = simulate_rank(
                    arch, init, gammas, depth, n=n, seed=seed, threshold=threshold, on_layer=bar.update
                )
    return results


def rank_csv(results: dict[tuple[str, str], torch.Tensor], gammas: Sequence[float]) -> str:
    """CSV text with columns ``arch,init,gamma,depth,rank``, one row per (arch, init, gamma, depth)."""
    lines = [",".join(CSV_COLUMNS)]
    for (arch, init), ranks in results.items():
        table = ranks.tolist()
        for j, gamma in enumerate(gammas):
            prefix = f"{arch},{init},{gamma:g},"
            lines.extend(f"{prefix}{i + 1},{row[j]}" for i, row in enumerate(table))
    return "\n".join(lines) + "\n"


def plot_rank_heatmap(ranks: torch.Tensor, gammas: Sequence[float], title: str, max_rank: int) -> bytes:
    """PNG bytes of a Fig. 1-style heatmap: gamma on x, depth on y (1 at the bottom), colour = rank.

    Args:
        ranks: (depth, G) ranks.
        gammas: The G gammas, increasing.
        title: Axes title.
        max_rank: Top of the colour scale (n).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = np.asarray(gammas, dtype=float)
    if len(g) > 1:
        mids = (g[1:] + g[:-1]) / 2
        g_edges = np.concatenate([[2 * g[0] - mids[0]], mids, [2 * g[-1] - mids[-1]]])
    else:
        g_edges = np.array([g[0] - 0.5, g[0] + 0.5])
    depth_edges = np.arange(ranks.shape[0] + 1) + 0.5
    fig, ax = plt.subplots(figsize=(4.2, 3.4), dpi=100, layout="constrained")
    mesh = ax.pcolormesh(g_edges, depth_edges, ranks.numpy(), cmap="viridis", vmin=1, vmax=max_rank, rasterized=True)
    if g_edges[0] <= -1 <= g_edges[-1]:
        ax.axvline(-1, color="white", linestyle="--", linewidth=0.8)
    ax.set_xlabel(r"offset $\gamma$")
    ax.set_ylabel("depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(mesh, ax=ax, label="rank")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_outputs(
    out_dir: str | Path,
    results: dict[tuple[str, str], torch.Tensor],
    gammas: Sequence[float],
    max_rank: int,
) -> list[Path]:
    """Write ``rank.csv`` and ``rank_<arch>_<init>.png`` per (arch, init) into ``out_dir``, atomically.

    Returns:
        The written paths, CSV first.
    """
    out_dir = Path(out_dir)
    paths = [out_dir / "rank.csv"]
    atomic_write_text(paths[0], rank_csv(results, gammas))
    titles = {"pre_ln": "Pre-LN", "post_ln": "Post-LN", "residual": "ResiDual"}
    for (arch, init), ranks in results.items():
        path = out_dir / f"rank_{arch}_{init}.png"
        init_name = "identity weights" if init == "identity" else "U[0,1] weights"
        atomic_write_bytes(path, plot_rank_heatmap(ranks, gammas, f"{titles[arch]}, {init_name}", max_rank))
        paths.append(path)
    return paths
