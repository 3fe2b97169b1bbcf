"""tools/infer.py: --cfg-options (the checkpoint's inference settings, infer.*, overridden as mmseg users do),
--follow-symlinks, folders that would make an output overwrite an input, the size cap and nonsense options."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.inference.test_runner import trained  # noqa: F401  (the module-scoped fixture)
from tools import infer as infer_cli
from wsss.config import ConfigError, InferConfig, from_dict
from wsss.config.validation import MAX_SIDE
from wsss.inference import predictor
from wsss.inference.predictor import Segmenter, longest_side
from wsss.model_file import read_model_file
from wsss.utils.fileio import read_mask


def test_cfg_options_override_inference_settings(trained, tmp_path, capsys):  # noqa: F811
    root, ckpt = trained
    out = tmp_path / "out"
    base = [str(ckpt), str(root), str(out), "--split", "val", "--no-progress", "--overwrite"]
    assert infer_cli.main([*base, "--cfg-options", "infer.scales=[0.5]", "infer.flip=False"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["scales"] == [0.5] and run["flip"] is False
    assert infer_cli.main([*base, "--cfg-options", "infer.cls_thresh=1.0"]) == 0  # no sigmoid exceeds 1
    labels = json.loads((out / "image_labels.json").read_text())
    assert labels["threshold"] == 1.0  # no class passes: each image's present class is its top-1
    assert all(v["top1_fallback"] and len(v["present"]) == 1 for v in labels["images"].values())
    capsys.readouterr()

    assert infer_cli.main([*base, "--cfg-options", "infer.scale=[1.0]"]) == 2
    assert "Did you mean 'infer.scales'?" in capsys.readouterr().err
    assert infer_cli.main([*base, "--cfg-options", "model.backbone=vit_base_patch16_224"]) == 2
    assert "only infer.* keys" in capsys.readouterr().err


def test_follow_symlinks_reads_a_folder_of_links(trained, tmp_path, capsys):  # noqa: F811
    root, ckpt = trained
    links = tmp_path / "val"
    links.mkdir()
    for image in sorted((root / "JPEGImages").glob("val_*.jpg")):
        os.symlink(image, links / image.name)
    assert infer_cli.main([str(ckpt), str(links), str(tmp_path / "safe"), "--no-progress"]) == 1  # nothing read
    assert "--follow-symlinks reads it" in capsys.readouterr().out
    out = tmp_path / "followed"
    assert infer_cli.main([str(ckpt), str(links), str(out), "--no-progress", "--follow-symlinks"]) == 0
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["val_00000.png", "val_00001.png"]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_an_input_folder_inside_the_output_is_refused(trained, tmp_path, capsys):  # noqa: F811
    """INPUT inside an output kind's folder of OUTPUT (thumbs/, masks/): refused, the inputs keep their bytes."""
    root, ckpt = trained
    proj = tmp_path / "proj"
    (proj / "thumbs").mkdir(parents=True)
    shutil.copy(root / "JPEGImages" / "val_00000.jpg", proj / "thumbs" / "a.jpg")
    (proj / "masks").mkdir()
    shutil.copy(root / "SegmentationClass" / "val_00000.png", proj / "masks" / "a.png")  # ground truth
    before = {p: p.read_bytes() for p in proj.rglob("*") if p.is_file()}
    for inp, extra in ((proj / "thumbs", ["--gallery"]), (proj / "masks", []), (proj / "masks", ["--overwrite"])):
        assert infer_cli.main([str(ckpt), str(inp), str(proj), "--no-progress", *extra]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert str(inp) in line and str(proj) in line, line
    assert {p: p.read_bytes() for p in proj.rglob("*") if p.is_file()} == before  # nothing written at all

    # INPUT beside the output kinds (proj/photos with OUTPUT proj) is fine: no output can land on it
    (proj / "photos").mkdir()
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", proj / "photos" / "b.jpg")
    photo = (proj / "photos" / "b.jpg").read_bytes()
    assert infer_cli.main([str(ckpt), str(proj / "photos"), str(proj), "--no-progress", "--gallery"]) == 0
    assert (proj / "masks" / "b.png").is_file() and (proj / "photos" / "b.jpg").read_bytes() == photo
    assert (proj / "masks" / "a.png").read_bytes() == before[proj / "masks" / "a.png"]


def test_an_output_that_is_an_input_file_is_refused(trained, tmp_path, capsys):  # noqa: F811
    """An input link (--follow-symlinks) to the very file an output path names: that image is skipped, unwritten."""
    root, ckpt = trained
    inp, out = tmp_path / "in", tmp_path / "out"
    (out / "masks").mkdir(parents=True)
    inp.mkdir()
    Image.open(root / "JPEGImages" / "val_00000.jpg").save(out / "masks" / "a.png")  # a photo kept there
    os.symlink(out / "masks" / "a.png", inp / "a.png")
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", inp / "b.jpg")
    photo = (out / "masks" / "a.png").read_bytes()
    assert infer_cli.main([str(ckpt), str(inp), str(out), "--no-progress", "--follow-symlinks"]) == 0
    printed = capsys.readouterr().out
    assert "a.png: its output" in printed and "is the input file" in printed, printed
    assert (out / "masks" / "a.png").read_bytes() == photo and (out / "masks" / "b.png").is_file()


def _recorded_sizes(monkeypatch) -> list[tuple[int, int]]:
    """Record the (H, W) the model is run at (before the TTA scales)."""
    sizes = []
    real = predictor.tta_forward

    def recording(model, x, *args, **kwargs):
        sizes.append(tuple(x.shape[-2:]))
        return real(model, x, *args, **kwargs)

    monkeypatch.setattr(predictor, "tta_forward", recording)
    return sizes


def test_max_size_has_a_default_cap_and_zero_means_none(trained, tmp_path, monkeypatch, capsys):  # noqa: F811
    root, ckpt = trained
    cap = InferConfig().max_size
    assert isinstance(cap, int) and 448 <= cap <= 2048  # bounded by default, training crops unchanged
    assert from_dict(InferConfig, {"max_size": None}).max_size == cap  # checkpoints written before the default
    inp = tmp_path / "in"
    inp.mkdir()
    Image.open(root / "JPEGImages" / "val_00000.jpg").resize((cap + 200, 40)).save(inp / "wide.png")
    sizes = _recorded_sizes(monkeypatch)
    options = ["--scales", "1.0", "--no-flip", "--workers", "0", "--no-progress"]
    assert infer_cli.main([str(ckpt), str(inp), str(tmp_path / "capped"), *options]) == 0
    assert sizes[-1][1] == cap and json.loads((tmp_path / "capped" / "run.json").read_text())["max_size"] == cap
    assert infer_cli.main([str(ckpt), str(inp), str(tmp_path / "full"), *options, "--max-size", "0"]) == 0
    assert sizes[-1] == (40, cap + 200)  # no cap of its own: the ceiling, 2048 px at scale 1, is what run.json records
    assert json.loads((tmp_path / "full" / "run.json").read_text())["max_size"] == MAX_SIDE
    assert read_mask(tmp_path / "full" / "masks" / "wide.png").shape == (40, cap + 200)
    assert len(sizes) == 2
    capsys.readouterr()


def test_no_source_lets_the_model_see_more_than_the_ceiling(trained, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Issue 38, 1.2: a checkpoint whose config sets infer.max_size=0 and infer.scales=[4.0] made the model see a
    photo at 4x its size (a 1000 x 1000 photo ran past 5 minutes). Whatever the source of the two settings (the
    checkpoint, --cfg-options, the predictor's arguments), an image is brought to at most MAX_SIDE / the largest
    scale before the scales, so the model never sees a side over MAX_SIDE (2048 px; run here with a ceiling of 64
    px, so that the tiny model runs at it in milliseconds)."""
    root, ckpt = trained
    assert (longest_side(0, [4.0]), longest_side(None, [1.0, 1.5]), longest_side(0, [1.0])) == (512, 1365, MAX_SIDE)
    assert (longest_side(1024, [1.0, 1.5]), longest_side(2048, [4.0]), longest_side(1, [4.0])) == (1024, 512, 1)
    crafted = read_model_file(ckpt)
    crafted["config"]["infer"].update(max_size=0, scales=[4.0])
    torch.save(crafted, tmp_path / "crafted.pth")
    inp = tmp_path / "in"
    inp.mkdir()
    Image.open(root / "JPEGImages" / "val_00000.jpg").resize((300, 200)).save(inp / "photo.png")
    monkeypatch.setattr(predictor, "MAX_SIDE", 64)
    seen = []
    real = predictor.tta_forward

    def recording(model, x, scales, *args, **kwargs):
        seen.append(max(x.shape[-2:]) * max(scales))
        return real(model, x, scales, *args, **kwargs)

    monkeypatch.setattr(predictor, "tta_forward", recording)
    options = ["--no-flip", "--workers", "0", "--no-progress"]
    uncapped = ["--cfg-options", "infer.max_size=0", "infer.scales=[4.0]"]
    runs = {
        "checkpoint": [str(tmp_path / "crafted.pth"), str(inp), str(tmp_path / "a"), *options],
        "--cfg-options": [str(ckpt), str(inp), str(tmp_path / "b"), *options, *uncapped],
        "--max-size 0": [str(ckpt), str(inp), str(tmp_path / "c"), *options, "--max-size", "0", "--scales", "4"],
    }
    for name, argv in runs.items():
        assert infer_cli.main(argv) == 0, name
        out = Path(argv[2])
        assert seen[-1] == 64 and json.loads((out / "run.json").read_text())["max_size"] == 16, name
        assert read_mask(out / "masks" / "photo.png").shape == (200, 300), name
    segmenter = Segmenter.from_checkpoint(ckpt, "cpu")
    result = segmenter.predict(inp / "photo.png", scales=[4.0], flip=False, max_size=0)
    assert seen[-1] == 64 and result.mask.shape == (200, 300)
    segmenter.predict(inp / "photo.png", scales=[4.0], flip=False, max_size=1000)  # an argument past the ceiling
    assert seen[-1] == 64
    capsys.readouterr()


@pytest.mark.parametrize(
    ("option", "values"),
    [("--scales", ["0"]), ("--scales", ["-1"]), ("--scales", ["1.0", "nan"]), ("--max-size", ["-1"]),
     ("--batch-size", ["0"]), ("--workers", ["-1"]), ("--crf-workers", ["-2"]),
     ("--scales", ["20"]), ("--max-size", ["100000"]), ("--crf-workers", ["100000"])],  # past the config's ceilings
)  # fmt: skip
def test_nonsense_options_are_refused(trained, tmp_path, capsys, option, values):  # noqa: F811
    root, ckpt = trained
    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(root), str(out), "--split", "val", "--no-progress", option, *values]) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(f"error: {option}: ")
    assert not (out / "masks").exists()


def test_a_zero_logits_stride_is_refused(trained, tmp_path, capsys):  # noqa: F811
    root, ckpt = trained
    with pytest.raises(ConfigError, match="infer.logits_stride"):
        InferConfig(logits_stride=0)
    base = [str(root), str(tmp_path / "out"), "--split", "val", "--no-progress", "--logits"]
    assert infer_cli.main([str(ckpt), *base, "--cfg-options", "infer.logits_stride=0"]) == 2
    assert "infer.logits_stride" in _one_error_line(capsys.readouterr().err)
    crafted = torch.load(ckpt, weights_only=True)
    crafted["config"]["infer"]["logits_stride"] = 0
    torch.save(crafted, tmp_path / "crafted.pth")
    assert infer_cli.main([str(tmp_path / "crafted.pth"), *base]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "infer.logits_stride" in line and "crafted.pth" in line, line


@pytest.mark.parametrize(
    "option, setting",
    [("infer.mask_classes='all'", "mask_classes"), ("infer.max_size=64", "max_size"), ("infer.flip=False", "flip")],
)
def test_kept_images_of_an_earlier_run_with_other_settings_are_noted(trained, tmp_path, capsys, option, setting):  # noqa: F811
    """A re-run with another setting the masks depend on keeps the finished images (no --overwrite) and says which
    setting differs; a re-run with the same settings says nothing."""
    root, ckpt = trained
    base = [str(ckpt), str(root), str(tmp_path / "out"), "--split", "val", "--no-progress", "--workers", "0",
            "--scales", "1.0"]  # fmt: skip
    assert infer_cli.main(base) == 0
    assert infer_cli.main(base) == 0
    assert not json.loads((tmp_path / "out" / "summary.json").read_text())["notes"]
    capsys.readouterr()
    assert infer_cli.main([*base, "--cfg-options", option]) == 0
    (note,) = json.loads((tmp_path / "out" / "summary.json").read_text())["notes"]
    assert note.startswith(f"2 images were kept from an earlier run with other settings ({setting})"), note
    assert "--overwrite" in note and f"note: {note}" in capsys.readouterr().out
