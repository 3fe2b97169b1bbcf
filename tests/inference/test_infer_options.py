"""tools/infer.py: --cfg-options (the checkpoint's inference settings, infer.*, overridden as mmseg users do) and
--follow-symlinks."""

from __future__ import annotations

import json
import os

from tests.inference.test_runner import trained  # noqa: F401  (the module-scoped fixture)
from tools import infer as infer_cli


def test_cfg_options_override_inference_settings(trained, tmp_path, capsys):  # noqa: F811
    root, ckpt = trained
    out = tmp_path / "out"
    base = [str(ckpt), str(root), str(out), "--split", "val", "--no-progress", "--overwrite"]
    assert infer_cli.main([*base, "--cfg-options", "infer.scales=[0.5]", "infer.flip=False"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["scales"] == [0.5] and run["flip"] is False
    assert infer_cli.main([*base, "--cfg-options", "infer.cls_thresh=1.0"]) == 0  # no sigmoid exceeds 1
    labels = json.loads((out / "image_labels.json").read_text())
    assert labels["threshold"] == 1.0 and not any(v["present"] for v in labels["images"].values())
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
