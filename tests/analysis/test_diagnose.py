"""Per-layer diagnostics: fully smoothed tokens, value ranges at init, mean/std over images, CLI smoke run."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from tests.conftest import record_at_calls, tf32_flags, tiny_config
from tools import diagnose as diagnose_cli
from wsss.analysis import diagnose as diagnose_module
from wsss.analysis.diagnose import (
    COLUMNS,
    ModelEntry,
    diagnose,
    model_from_config,
    plot_layers,
    prepare_image,
    write_layers_csv,
)
from wsss.analysis.oversmoothing import layer_stats
from wsss.config import AttentionConfig, dump_config
from wsss.engine.train import train
from wsss.models import attention_args, build_backbone
from wsss.utils.fileio import save_image

TINY_VIT = {"depth": 3, "embed_dim": 32, "num_heads": 2, "patch_size": 8}
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


def tiny_backbone(attention: str, seed: int = 0):
    torch.manual_seed(seed)
    variant = attention_args(AttentionConfig(name=attention))
    backbone = build_backbone("vit_tiny_patch16_224", backbone_kwargs=TINY_VIT, **variant)
    return backbone.eval()


def random_images(n: int, size: tuple[int, int] = (32, 40), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, *size, generator=g) for _ in range(n)]


@pytest.mark.parametrize("attention", ["vanilla", "centered"])
def test_identical_tokens_are_fully_smoothed_in_every_layer(attention):
    backbone = tiny_backbone(attention)
    images = random_images(3)
    before = diagnose({"m": ModelEntry(backbone, MEAN, STD)}, images)
    assert max(r["cosine"] for r in before) < 0.9 and min(r["effective_rank"] for r in before) > 2
    # Zero patch-embedding weights and position embedding, non-zero bias: every patch token enters block 0
    # equal (and not zero); a block maps equal patch tokens to equal tokens.
    vit = backbone.vit
    with torch.no_grad():
        vit.patch_embed.proj.weight.zero_()
        vit.patch_embed.proj.bias.copy_(torch.linspace(-1.0, 2.0, vit.embed_dim))
        vit.pos_embed.zero_()
    rows = diagnose({"m": ModelEntry(backbone, MEAN, STD)}, images)
    assert [r["layer"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["cosine"] == pytest.approx(1.0, abs=1e-5) and r["cosine_std"] == pytest.approx(0.0, abs=1e-5)
        assert r["effective_rank"] == pytest.approx(1.0, abs=1e-3)
        assert r["effective_rank_std"] == pytest.approx(0.0, abs=1e-3)
        # equal patch rows and columns: only the class token's row and column can add a second direction
        assert 1 <= r["attn_numerical_rank"] <= 2
        assert r["images"] == 3 and r["tokens"] == 4 * 5 and r["dim"] == 32


def test_untrained_model_gives_finite_values_in_range():
    rows = diagnose({"centered": ModelEntry(tiny_backbone("centered"), MEAN, STD)}, random_images(4))
    assert len(rows) == TINY_VIT["depth"]
    n, d = 4 * 5, TINY_VIT["embed_dim"]
    for r in rows:
        values = [r[c] for c in COLUMNS[2:]]
        assert all(math.isfinite(v) for v in values), r
        assert -1 / (n - 1) <= r["cosine"] < 0.9
        assert 2 < r["effective_rank"] <= min(n, d)
        assert 2 <= r["attn_numerical_rank"] <= n + 1  # (n + class token) x (n + class token) matrices
        assert all(r[f"{m}_std"] >= 0 for m in ("cosine", "effective_rank", "attn_numerical_rank"))
        assert r["cosine_std"] > 0  # random images do differ


def test_mean_and_std_over_images_and_own_normalisation():
    backbone = tiny_backbone("vanilla")
    x1, x2 = random_images(2, seed=3)
    entry = {"v": ModelEntry(backbone, MEAN, STD)}
    both = diagnose(entry, [x1, x2])
    # reference: layer_stats on each image normalised by hand with the entry's mean and std
    m, s = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    refs = [layer_stats(backbone.vit, ((x - m) / s)[None]) for x in (x1, x2)]
    for row, a, b in zip(both, *refs, strict=True):
        for metric in ("cosine", "effective_rank", "attn_numerical_rank"):
            assert row[metric] == pytest.approx((a[metric] + b[metric]) / 2, rel=1e-5, abs=1e-7)
            assert row[f"{metric}_std"] == pytest.approx(abs(a[metric] - b[metric]) / 2, rel=1e-4, abs=1e-7)
    # another normalisation changes the numbers (so the check above can fail)
    other = diagnose({"v": ModelEntry(backbone, (0.0,) * 3, (1.0,) * 3)}, [x1, x2])
    assert any(abs(a["cosine"] - b["cosine"]) > 1e-4 for a, b in zip(both, other, strict=True))
    with pytest.raises(ValueError, match="one size"):
        diagnose(entry, [x1, torch.rand(3, 32, 32)])
    with pytest.raises(TypeError, match="VisionTransformer"):
        diagnose({"bad": ModelEntry(torch.nn.Linear(3, 3), MEAN, STD)}, [x1])


def test_the_models_run_with_ieee_float32_products(monkeypatch):
    """On a GPU the statistics are the CPU's: TF32 products (PyTorch's default for convolutions, the patch embedding)
    would err by up to half the numerical-rank threshold. The process's flags are back after the run."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default for convolutions
    seen, before = record_at_calls(monkeypatch, diagnose_module, "layer_stats"), tf32_flags()
    models = {name: ModelEntry(tiny_backbone(name), MEAN, STD) for name in ("vanilla", "centered")}
    diagnose(models, random_images(2))
    assert seen == [(False, False)] * 4 and tf32_flags() == before


def test_prepare_image_resizes_shorter_side_and_center_crops():
    rng = np.random.default_rng(0)
    square = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    torch.testing.assert_close(prepare_image(square, 16), torch.from_numpy(square).permute(2, 0, 1) / 255.0)
    # 32 x 96 -> 16 x 48 -> columns 16..31 of the resized image: the middle third of the original
    wide = np.zeros((32, 96, 3), dtype=np.uint8)
    wide[:, 32:64] = 200
    out = prepare_image(wide, 16)
    assert out.shape == (3, 16, 16)
    torch.testing.assert_close(out[:, :, 1:-1], torch.full((3, 16, 14), 200 / 255))  # edges blur with the rest
    tall = rng.integers(0, 256, size=(50, 20, 3), dtype=np.uint8)
    tall = np.ascontiguousarray(tall[:, list(range(10)) + list(range(9, -1, -1))])  # left-right symmetric
    out = prepare_image(tall, 8)
    assert out.shape == (3, 8, 8) and 0 <= out.min() and out.max() <= 1
    torch.testing.assert_close(out, out.flip(-1))


def test_config_models_share_random_weights_across_variants(tiny_voc, tmp_path):
    cfg_file = tmp_path / "tiny.py"
    dump_config(tiny_config(tiny_voc), cfg_file)
    centered = model_from_config(cfg_file, pretrained="", seed=5)
    vanilla = model_from_config(cfg_file, pretrained="", options={"model.attention.name": "vanilla"}, seed=5)
    other = model_from_config(cfg_file, pretrained="", seed=6)
    assert type(centered.model.vit.blocks[0].attn).__name__ == "CenteredAttention"
    assert type(vanilla.model.vit.blocks[0].attn).__name__ == "VanillaAttention"
    a, b, c = (e.model.state_dict() for e in (centered, vanilla, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["vit.blocks.0.attn.qkv.weight"], c["vit.blocks.0.attn.qkv.weight"])
    # timm's constants for the configured backbone (vit_tiny's default weights use 0.5, not ImageNet's)
    assert vanilla.mean == (0.5, 0.5, 0.5) and vanilla.std == (0.5, 0.5, 0.5)


def test_csv_writes_missing_attention_as_empty_cells(tmp_path):
    row = {c: None for c in COLUMNS} | {"model": "m", "layer": 0, "cosine": 0.5, "cosine_std": 0.0,
                                       "effective_rank": 3.25, "effective_rank_std": 0.125,
                                       "images": 2, "tokens": 4, "dim": 8}  # fmt: skip
    write_layers_csv([row], tmp_path / "l.csv")
    lines = (tmp_path / "l.csv").read_text().splitlines()
    assert lines == [",".join(COLUMNS), "m,0,0.5,0,3.25,0.125,,,2,4,8"]
    plot_layers([row, row | {"layer": 1}], tmp_path / "l.png")  # a None panel stays empty, no error
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_two_models_csv_png_and_corrupt_image(tiny_voc, tmp_path, capsys):
    ckpt = train(tiny_config(tiny_voc, max_iters=2, ckpt_interval=2), work_dir=tmp_path / "w", device="cpu").checkpoint
    images = tmp_path / "images"
    rng = np.random.default_rng(1)
    for rel, (h, w) in {"a.jpg": (40, 60), "sub/b.png": (50, 30), "c.jpg": (32, 32)}.items():
        save_image(images / rel, rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
    (images / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (images / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    argv = [str(ckpt), str(images), "--timm", "vit_tiny_patch16_224", "--pretrained", "none", "--size", "32",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert diagnose_cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "skipped broken.jpg" in printed and "skipped notes.txt" in printed
    with open(out / "layers.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [r["model"] for r in rows] == ["w/iter_2"] * 3 + ["vit_tiny_patch16_224"] * 12  # models x layers
    assert [int(r["layer"]) for r in rows] == [0, 1, 2, *range(12)]
    assert {r["images"] for r in rows} == {"3"}
    assert {(r["model"], r["tokens"], r["dim"]) for r in rows} == {
        ("w/iter_2", "16", "32"), ("vit_tiny_patch16_224", "4", "192")
    }  # fmt: skip
    for r in rows:
        assert 0 < float(r["effective_rank"]) <= int(r["tokens"]) and float(r["attn_numerical_rank"]) >= 1
    png = (out / "layers.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    argv = [str(images), "--timm", "vit_tiny_patch16_224", "--pretrained", "none", "--size", "32", "--out",
            str(tmp_path / "one"), "--max-images", "2", "--label", "tiny", "--no-progress"]  # fmt: skip
    assert diagnose_cli.main(argv) == 0
    rows = list(csv.DictReader(open(tmp_path / "one" / "layers.csv", newline="")))
    assert {r["model"] for r in rows} == {"tiny"} and {r["images"] for r in rows} == {"2"}


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        diagnose_cli.main([str(tmp_path)])  # no model
    with pytest.raises(SystemExit):
        diagnose_cli.main([str(tmp_path), "--timm", "vit_tiny_patch16_224", "--label", "a", "b"])
    assert "distinct labels" in capsys.readouterr().err
    rc = diagnose_cli.main([str(tmp_path / "missing"), "--timm", "vit_tiny_patch16_224", "--pretrained", "none"])
    assert rc == 2 and f"IMAGES {tmp_path / 'missing'} not found" in capsys.readouterr().err
