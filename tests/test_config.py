from __future__ import annotations

from pathlib import Path

import pytest

from wsss.config import Config, ConfigError, dump_config, from_dict, load_config, parse_cfg_options

REPO = Path(__file__).resolve().parents[1]


def test_paper_config_values():
    cfg = load_config(REPO / "configs" / "voc_centered.py")
    assert cfg.model.backbone == "deit_small_patch16_224"
    assert cfg.model.attention.name == "centered" and cfg.model.attention.gamma == -1.0
    assert cfg.model.aux_layer == -3
    assert cfg.train.max_iters == 80000 and cfg.train.batch_size == 4
    assert cfg.data.crop_size == 448 and cfg.data.scale_range == (0.5, 2.0)
    assert cfg.cam.scales == (1.0, 0.5, 1.5)
    assert cfg.par.dilations == (1, 2, 4, 8, 12, 24)
    assert cfg.optim.lr == 6e-5 and cfg.optim.warmup_iters == 2500
    assert len(cfg.data.classes) == 21


def test_base_inheritance_overrides_only_what_it_names():
    cfg = load_config(REPO / "configs" / "voc_vanilla.py")
    assert cfg.model.attention.name == "vanilla"
    assert cfg.model.attention.gamma == -1.0  # inherited untouched
    assert cfg.work_dir == "work_dirs/voc_vanilla"


def test_cfg_options_override_and_coerce():
    opts = parse_cfg_options(["train.max_iters=100", "cam.scales=[1.0,2]", "model.attention.blocks=[0,-1]"])
    cfg = load_config(REPO / "configs" / "voc_centered.py", opts)
    assert cfg.train.max_iters == 100
    assert cfg.cam.scales == (1.0, 2.0) and isinstance(cfg.cam.scales, tuple)
    assert cfg.model.attention.blocks == [0, -1]


def test_dump_and_reload_is_identical(tmp_path):
    cfg = load_config(REPO / "configs" / "voc_centered.py", {"train.max_iters": 7, "data.classes": ["bg", "x"]})
    dump_config(cfg, tmp_path / "resolved.py")
    again = load_config(tmp_path / "resolved.py")
    assert again == cfg
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"train": {"max_iter": 5}}, "train.max_iter"),
        ({"trian": {}}, "trian"),
        ({"model": {"attention": {"gama": -1}}}, "model.attention.gama"),
    ],
)
def test_unknown_key_is_named(data, key):
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'"):
        from_dict(Config, data)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="Did you mean 'train.max_iters'"):
        from_dict(Config, {"train": {"max_iter": 5}})


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"train": {"max_iters": "80k"}}, "train.max_iters"),
        ({"train": {"max_iters": 1.5}}, "train.max_iters"),
        ({"train": {"amp": 1}}, "train.amp"),
        ({"optim": {"lr": True}}, "optim.lr"),
        ({"optim": {"betas": [0.9]}}, "optim.betas"),
        ({"cam": {"scales": ["a"]}}, r"cam.scales\[0\]"),
        ({"data": {"classes": 3}}, "data.classes"),
        ({"model": "deit"}, "model"),
    ],
)
def test_wrong_type_is_named(data, key):
    with pytest.raises(ConfigError, match=key):
        from_dict(Config, data)


def test_unknown_key_in_file_and_missing_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("train = dict(max_iterz=3)\n")
    with pytest.raises(ConfigError, match="train.max_iterz"):
        load_config(bad)
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config(tmp_path / "nope.py")


def test_int_accepted_for_float():
    cfg = from_dict(Config, {"optim": {"lr": 1}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
