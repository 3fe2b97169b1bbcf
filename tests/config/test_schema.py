"""The schema: the paper's defaults, unknown keys, wrong types and choices, each refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.conftest import one_error_line
from tests.conftest import tiny_config
from tools import train as train_cli
from wsss.config import Config, ConfigError, ModelConfig, dump_config, from_dict, load_config, parse_cfg_options
from wsss.models import build_model

REPO = Path(__file__).resolve().parents[2]

# docs/design.md section 3 (the paper, and ToCo's released training where the paper is silent); docs/reference.md.
PAPER_CONSTANTS = {
    "model.backbone": "deit_small_patch16_224",
    "model.pretrained": "hub",
    "model.drop_path_rate": 0.0,
    "model.freeze_pos_embed": True,
    "model.pos_embed_interp": "bicubic",
    "model.attention.name": "centered",
    "model.attention.gamma": -1.0,
    "model.attention.blocks": None,
    "model.aux_layer": -3,
    "model.decoder_channels": 512,
    "model.decoder_dilation": 5,
    "model.head_init": "default",
    "data.crop_size": 448,
    "data.scale_range": (0.5, 2.0),
    "data.hflip_prob": 0.5,
    "data.color_jitter": (0.4, 0.4, 0.2, 0.1),
    "data.color_jitter_prob": 0.8,
    "data.grayscale_prob": 0.2,
    "data.blur_prob": 1.0,
    "data.blur_sigma": (0.1, 2.0),
    "data.pad_rgb": (0.0, 0.0, 0.0),
    "data.ignore_index": 255,
    "data.train_split": "train_aug",
    "data.val_split": "val",
    "cam.scales": (1.0, 0.5, 1.5),
    "cam.fg_thresh": 0.7,
    "cam.bg_thresh": 0.25,
    "cam.infer_bg_thresh": 0.5,
    "par.num_iter": 10,
    "par.dilations": (1, 2, 4, 8, 12, 24),
    "par.w1": 0.3,
    "par.w2": 0.01,
    "par.scale": 0.5,
    "loss.aux_weight": 1.0,
    "loss.seg_weight": 0.1,
    "loss.reg_weight": 0.05,
    "loss.seg_start_iter": 2001,
    "loss.reg_energy_weight": 1e-7,
    "loss.reg_lattice_match": 0.59,
    "loss.reg_sigma_rgb": 15.0,
    "loss.reg_sigma_xy": 100.0,
    "loss.reg_scale": 0.5,
    "optim.lr": 6e-5,
    "optim.head_lr_mult": 10.0,
    "optim.weight_decay": 0.01,
    "optim.no_decay_1d": False,
    "optim.betas": (0.9, 0.999),
    "optim.warmup_iters": 2500,
    "optim.warmup_ratio": 1e-6,
    "optim.power": 0.9,
    "train.max_iters": 80000,
    "train.batch_size": 4,
    "train.amp": False,  # the reference autocasts nothing
    "train.cam_dtype": "float32",
    "train.fp32_precision": "tf32",  # torch 1.10 on A100 (the reference's log): TF32 products by default
    "train.val_input": "crop",
    "infer.scales": (1.0, 1.25, 1.5),
    "infer.flip": True,
    "infer.fp32_precision": "tf32",  # as train.fp32_precision
    "infer.dtype": "float32",  # the reference's inference casts nothing
    "infer.crf.gaussian_sxy": 1.0,
    "infer.crf.gaussian_compat": 1.0,
    "infer.crf.bilateral_sxy": 121.0,
    "infer.crf.bilateral_srgb": 5.0,
    "infer.crf.bilateral_compat": 4.0,
    "infer.crf.iterations": 10,
}


@pytest.mark.parametrize(("key", "expected"), list(PAPER_CONSTANTS.items()))
def test_paper_config_pins_the_reference_constants(key, expected):
    value = load_config(REPO / "configs" / "voc_centered.py")
    for part in key.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected), f"{key} = {value!r}, the reference has {expected!r}"


def test_paper_config_has_vocs_classes():
    cfg = load_config(REPO / "configs" / "voc_centered.py")
    assert len(cfg.data.classes) == 21 and cfg.data.classes[0] == "background"


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


def test_int_accepted_for_float():
    cfg = from_dict(Config, {"optim": {"lr": 1}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)


def test_choice_fields_reject_unknown_values():
    with pytest.raises(ConfigError, match=r"train.cam_dtype.*'fp16' is not one of 'float32', 'bfloat16'"):
        from_dict(Config, {"train": {"cam_dtype": "fp16"}})
    with pytest.raises(ConfigError, match=r"train.val_input"):
        from_dict(Config, {"train": {"val_input": "448"}})
    assert from_dict(Config, {"train": {"val_input": "original"}}).train.val_input == "original"


@pytest.mark.parametrize(
    ("section", "key", "value", "rule"),
    [
        ("train", "ckpt_interval", 0, "> 0"),
        ("train", "max_iters", 0, "> 0"),
        ("train", "batch_size", -2, "> 0"),
        ("train", "val_interval", 0, "> 0"),
        ("train", "log_interval", 0, "> 0"),
        ("optim", "lr", -1.0, "finite and > 0"),
        ("optim", "lr", float("nan"), "finite and > 0"),
        ("optim", "head_lr_mult", 0.0, "finite and > 0"),
        ("optim", "weight_decay", -0.01, "finite and >= 0"),
        ("optim", "warmup_iters", -1, ">= 0"),
    ],
)
def test_out_of_range_values_are_named(section, key, value, rule):
    with pytest.raises(ConfigError, match=rf"config key '{section}.{key}': must be {rule}, got"):
        from_dict(Config, {section: {key: value}})
    assert from_dict(Config, {"optim": {"warmup_iters": 0, "weight_decay": 0.0}}).optim.warmup_iters == 0


def test_backbone_kwargs_of_the_shipped_configs_are_accepted():
    for path in sorted((REPO / "configs").glob("*.py")):
        load_config(path)
    cfg = load_config(REPO / "configs" / "toy_v3_pretrain.py", {"model.backbone_kwargs.img_size": [64, 96]})
    assert cfg.model.backbone_kwargs["img_size"] == (64, 96)
    assert cfg.model.backbone_kwargs["global_pool"] == "max" and cfg.model.backbone_kwargs["fc_norm"] is False


def test_aux_block_beyond_the_depth_names_both_keys_before_training(tiny_voc, tmp_path, capsys):
    cfg = tmp_path / "cfg.py"
    dump_config(tiny_config(tiny_voc), cfg)
    options = ["model.backbone_kwargs.depth=2", "model.aux_layer=-3"]
    assert load_config(cfg, parse_cfg_options(options)).model.aux_layer == -3  # a pre-training config needs no aux
    argv = [str(cfg), "--work-dir", str(tmp_path / "w"), "--device", "cpu", "--cfg-options", *options]
    assert train_cli.main(argv) == 2
    assert one_error_line(capsys) == (
        "error: config keys 'model.aux_layer' (-3) and 'model.backbone_kwargs.depth' (2 for vit_tiny_patch16_224): "
        "block -3 does not exist; set model.aux_layer within [-2, 1] or raise the depth\n"
    )
    assert not (tmp_path / "w" / "config.py").exists()
    default_depth = ModelConfig(backbone="vit_tiny_patch16_224", pretrained="", aux_layer=-13, decoder_channels=8)
    with pytest.raises(ValueError, match=r"'model.aux_layer' \(-13\) and 'model.backbone_kwargs.depth' \(12 for"):
        build_model(default_depth, num_classes=3)
