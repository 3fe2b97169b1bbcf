from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from tools.simulate_rank import main
from wsss.analysis.oversmoothing import numerical_rank
from wsss.analysis.rank_simulation import (
    CSV_COLUMNS,
    gram_rank,
    offset_attention,
    parse_gammas,
    rank_csv,
    row_normalize,
    run_grid,
    simulate_rank,
    write_outputs,
)


def test_parse_gammas():
    gammas = parse_gammas("-1.5:1.5:0.1")
    assert len(gammas) == 31
    assert gammas[0] == -1.5 and gammas[-1] == 1.5
    assert gammas[5] == -1.0 and gammas[15] == 0.0
    assert parse_gammas("-1, 0,0.5") == [-1.0, 0.0, 0.5]
    assert parse_gammas("0:1:0.3") == [0.0, 0.3, 0.6, 0.9]
    with pytest.raises(ValueError):
        parse_gammas("1:0:0.1")


def test_row_normalize_keeps_zero_rows():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(row_normalize(x), torch.tensor([[0.6, 0.8], [0.0, 0.0]], dtype=torch.float64))


def test_offset_attention_by_hand():
    # X = I_2, identity weights: logits I / sqrt2, softmax rows (e^a, 1) / (e^a + 1) with a = 1/sqrt2;
    # V = I, so S = A + gamma/2 * ones.
    e = math.exp(1 / math.sqrt(2))
    a = torch.tensor([[e, 1.0], [1.0, e]], dtype=torch.float64) / (e + 1)
    x = torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    out = offset_attention(x, torch.tensor([0.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(out[0], a)
    torch.testing.assert_close(out[1], a - 0.5)
    torch.testing.assert_close(out[1].sum(-1), torch.zeros(2, dtype=torch.float64))


def test_offset_attention_matches_the_formula_with_weights():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    w = torch.rand(3, 4, 4, generator=g, dtype=torch.float64)
    gammas = torch.tensor([-1.0, 0.0, 0.7], dtype=torch.float64)
    for i, gamma in enumerate(gammas.tolist()):
        xi = x[i]
        attn = torch.softmax((xi @ w[0]) @ (xi @ w[1]).T / 2.0, dim=-1) + gamma * torch.ones(5, 5) / 5
        torch.testing.assert_close(offset_attention(x, gammas, w)[i], attn @ xi @ w[2])


def test_gram_rank_matches_svd_count():
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    # Singular values relative to ||M||_F = 1: two clearly above 1e-3, one just above, one just below, one 0.
    s = torch.tensor([0.0, 1.2e-3, 0.9e-3, 0.2, 0.0], dtype=torch.float64)
    s[0] = math.sqrt(1 - (s[1:] ** 2).sum().item())
    m = 7.0 * u[:, :5] @ torch.diag(s) @ v.T
    assert numerical_rank(m).item() == 3
    assert gram_rank(m).item() == 3
    assert gram_rank(m.T).item() == 3
    batch = torch.randn(4, 8, 8, generator=g, dtype=torch.float64)
    batch[1] = batch[1, :1].expand(8, 8)  # rank 1
    assert torch.equal(gram_rank(batch), numerical_rank(batch))
    with pytest.raises(ValueError):
        gram_rank(m, threshold=1e-8)


def test_rank_of_identity_is_n():
    assert gram_rank(torch.eye(100)).item() == 100
    assert numerical_rank(torch.eye(100)).item() == 100


def symmetric_reference(arch: str, gamma: float, n: int, depth: int, threshold: float = 1e-3) -> list[int]:
    """Closed-form ranks of the identity-weight networks on X_1 = I (n = d).

    Every token is alike up to a permutation, so all matrices stay ``a J/n + b (I - J/n)``: singular value
    |a| once (on the all-ones direction) and |b| n - 1 times. A row of such a matrix has squared norm
    ``(a^2 + (n-1) b^2) / n``. For tokens ``a J/n + b (I - J/n)`` the logits are ``(a^2/n + b^2 (n-1)/n)``
    on the diagonal and ``(a^2 - b^2)/n`` off it (over sqrt(d)); the softmax matrix then has eigenvalue 1 on
    the ones and ``lam = (p - q) / (p + (n-1) q)`` on the rest, and S_gamma scales a by ``1 + gamma``,
    b by ``lam``.
    """

    def attention(a: float, b: float) -> tuple[float, float]:
        p = math.exp((a * a / n + b * b * (n - 1) / n) / math.sqrt(n))
        q = math.exp((a * a - b * b) / n / math.sqrt(n))
        lam = (p - q) / (p + (n - 1) * q)
        return (1 + gamma) * a, lam * b

    def normalize(a: float, b: float) -> tuple[float, float]:
        norm = math.sqrt((a * a + (n - 1) * b * b) / n)
        return a / norm, b / norm

    def rank(a: float, b: float) -> int:
        fro = math.sqrt(a * a + (n - 1) * b * b)
        return int(abs(a) > threshold * fro) + (n - 1) * int(abs(b) > threshold * fro)

    a, b = 1.0, 1.0  # X_1 = I
    ra, rb = 1.0, 1.0  # R_1 = I
    ranks = []
    for _ in range(depth):
        if arch == "pre_ln":
            sa, sb = attention(*normalize(a, b))
            a, b = a + sa, b + sb
            out = (a, b)
        else:
            sa, sb = attention(a, b)
            a, b = normalize(a + sa, b + sb)
            ra, rb = ra + sa, rb + sb
            out = (a, b)
            if arch == "residual":
                na, nb = normalize(ra, rb)
                out = (na + a, nb + b)
        ranks.append(rank(*out))
    return ranks


@pytest.mark.parametrize("arch", ["pre_ln", "post_ln", "residual"])
def test_identity_weights_match_closed_form(arch):
    gammas = [-1.5, -1.0, -0.5, 0.0, 1.0]
    ranks = simulate_rank(arch, "identity", gammas, depth=400, n=8)
    for j, gamma in enumerate(gammas):
        assert ranks[:, j].tolist() == symmetric_reference(arch, gamma, 8, 400), (arch, gamma)
    # Within 400 layers every block type collapses to rank 1 at gamma = 0 and keeps rank >= n - 1 at -1.
    assert ranks[-1, 3] == 1 and ranks[-1, 1] >= 7


def test_post_ln_gamma0_collapses_within_10_layers_gamma_minus1_keeps_rank():
    ranks = simulate_rank("post_ln", "identity", [0.0, -1.0], depth=50, n=100)
    # gamma = 0 doubles the all-ones component per layer while the rest grows by ~1.001:
    # after 9 layers b / ||X||_F = 1 / sqrt(511^2 + 99) > 1e-3, after 10 about 1 / 1022 < 1e-3.
    assert ranks[:9, 0].tolist() == [100] * 9
    assert ranks[9:, 0].tolist() == [1] * 41
    assert ranks[:, 1].tolist() == [100] * 50
    assert ranks[:, 0].tolist() == symmetric_reference("post_ln", 0.0, 100, 50)


def test_uniform_weights_shared_across_gammas_and_finite():
    both = simulate_rank("post_ln", "uniform", [0.0, -1.0], depth=15, n=10, seed=3)
    alone = simulate_rank("post_ln", "uniform", [-1.0], depth=15, n=10, seed=3)
    assert torch.equal(both[:, 1], alone[:, 0])
    assert both.min() >= 1 and both.max() <= 10


def test_csv_columns_and_rows(tmp_path: Path):
    gammas = [-1.0, 0.0, 0.5]
    results = run_grid(["post_ln", "residual"], ["identity", "uniform"], gammas, depth=4, n=6, progress=False)
    rows = list(csv.DictReader(rank_csv(results, gammas).splitlines()))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 2 * 2 * 3 * 4
    for row in rows:
        ranks = results[row["arch"], row["init"]]
        j = gammas.index(float(row["gamma"]))
        assert int(row["rank"]) == ranks[int(row["depth"]) - 1, j].item()
    assert {int(r["depth"]) for r in rows} == {1, 2, 3, 4}

    paths = write_outputs(tmp_path, results, gammas, max_rank=6)
    assert [p.name for p in paths] == [
        "rank.csv",
        "rank_post_ln_identity.png",
        "rank_post_ln_uniform.png",
        "rank_residual_identity.png",
        "rank_residual_uniform.png",
    ]
    with Image.open(paths[1]) as im:
        assert im.format == "PNG"


def test_cli_smoke(tmp_path: Path):
    out = tmp_path / "sim"
    argv = ["--out", str(out), "--depth", "5", "--n", "6", "--gammas", "-1:0:0.5", "--no-progress"]
    assert main(argv + ["--archs", "pre_ln", "post_ln", "--inits", "uniform"]) == 0
    with open(out / "rank.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 1 * 3 * 5
    assert {(r["arch"], r["init"], r["gamma"]) for r in rows} == {
        (a, "uniform", g) for a in ("pre_ln", "post_ln") for g in ("-1", "-0.5", "0")
    }
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["rank_post_ln_uniform.png", "rank_pre_ln_uniform.png"]
