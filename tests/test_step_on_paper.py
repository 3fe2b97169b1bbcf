"""bench/step_on_paper.py: a model pass's H100 bound counts its attention at the rate PyTorch computes it (float32
attention as three TF32 products whatever the TF32 flags, bf16 attention at the bf16 rate; docs/benchmarks.md,
"Attention in float32 is three TF32 products")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import step_on_paper  # noqa: E402
from step_on_paper import H100  # noqa: E402

from wsss.config import load_config  # noqa: E402


@pytest.fixture(scope="module")
def paper():
    return load_config(REPO / "configs" / "voc_centered.py", {"model.pretrained": ""})


def test_a_vit_block_s_products_and_attention_are_counted_apart():
    """Two tokens of width 3 through one block of MLP ratio 4: qkv 3, proj 1 and the MLP 8 widths of products per token;
    ``q k^T`` and ``a v``, 2 x 2 x tokens^2 x width."""
    assert step_on_paper.vit_forward_flops(2, 3, 1, 4) == (2 * 2 * 3 * (3 + 1 + 8) * 3, 2 * 2 * 2 * 2 * 3)
    assert step_on_paper.vit_forward_flops(2, 3, 5, 4) == (5 * 432, 5 * 48)


def test_float32_attention_runs_at_a_third_of_tf32_in_both_precisions(paper):
    rows = {name: seconds for name, _, _, _, seconds in step_on_paper.stages(paper)}
    assert H100["fp32 attention"] == pytest.approx(H100["tf32 tensor"] / 3)
    for precision, rate in (("tf32", "tf32 tensor"), ("ieee", "fp32 cuda cores")):
        assert step_on_paper.model_seconds(6.0, 0.0, precision) == pytest.approx(6.0 / H100[rate])
        assert step_on_paper.model_seconds(0.0, 6.0, precision) == pytest.approx(18.0 / H100["tf32 tensor"])
    assert step_on_paper.model_seconds(2.0, 4.0, "bf16") == pytest.approx(6.0 / H100["bf16 tensor"])
    tf32, ieee, bf16 = (rows[f"CAM pass, {name}"] for name in ("float32, TF32 (reference)",
                                                               "float32, train.fp32_precision=ieee",
                                                               "train.cam_dtype=bfloat16"))  # fmt: skip
    assert ieee > tf32 > 3 * bf16  # attention is 43 % of the 672-px pass: TF32 no longer half of bf16's rate
    assert tf32 == pytest.approx(5.26e-3, rel=1e-3) and bf16 == pytest.approx(1.51e-3, rel=1e-2)


def test_the_inference_rows_add_the_attention_at_its_own_rate(paper):
    (_, single_flops, single), (_, tta_flops, tta) = step_on_paper.inference_rows(paper)
    assert tta_flops > 10 * single_flops
    assert tta["bf16"] == pytest.approx(tta_flops / H100["bf16 tensor"])  # flash attention: one rate
    assert tta_flops / H100["tf32 tensor"] < tta["TF32"] < tta_flops / H100["fp32 attention"]
    assert 1 / tta["TF32"] == pytest.approx(539, abs=1) and 1 / tta["bf16"] == pytest.approx(1777, abs=1)
