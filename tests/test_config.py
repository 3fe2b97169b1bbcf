from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import tiny_config
from tools import train as train_cli
from wsss.config import Config, ConfigError, ModelConfig, dump_config, from_dict, load_config, parse_cfg_options
from wsss.models import build_model

REPO = Path(__file__).resolve().parents[1]


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
    "train.cam_dtype": "float32",
    "train.val_input": "crop",
    "infer.scales": (1.0, 1.25, 1.5),
    "infer.flip": True,
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
        ("optim", "lr", -1.0, "> 0"),
        ("optim", "lr", float("nan"), "> 0"),
        ("optim", "head_lr_mult", 0.0, "> 0"),
        ("optim", "weight_decay", -0.01, ">= 0"),
        ("optim", "warmup_iters", -1, ">= 0"),
    ],
)
def test_out_of_range_values_are_named(section, key, value, rule):
    with pytest.raises(ConfigError, match=rf"config key '{section}.{key}': must be {rule}, got"):
        from_dict(Config, {section: {key: value}})
    assert from_dict(Config, {"optim": {"warmup_iters": 0, "weight_decay": 0.0}}).optim.warmup_iters == 0


def test_train_cli_reports_config_errors_in_one_line(tmp_path, capsys):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("train = dict(max_iters=3)\n")
    assert train_cli.main([str(cfg), "--work-dir", str(tmp_path / "w"), "--cfg-options", "train.ckpt_interval=0"]) == 2
    assert capsys.readouterr().err == "error: config key 'train.ckpt_interval': must be > 0, got 0\n"
    assert train_cli.main([str(tmp_path / "nope.py")]) == 2
    assert capsys.readouterr().err.startswith("error: config file not found")


def test_cfg_options_keep_spaces_and_parse_lists_numbers_bools_none():
    opts = parse_cfg_options([
        "data.root=/data/my set", "work_dir= runs/a  b", "data.classes=[background, my cat, 'dog']",
        "cam.scales=[1.0, 0.5]", "optim.betas=(0.9, 0.99)", "data.pad_rgb=1,2,3", "model.attention.blocks=None",
        "train.amp=false", "train.max_iters= 7", "optim.lr=1e-3", "data.mask_dir=", "x=[(1, 2), [a, b], c]",
    ])  # fmt: skip
    assert opts == {
        "data.root": "/data/my set", "work_dir": " runs/a  b", "data.classes": ["background", "my cat", "dog"],
        "cam.scales": [1.0, 0.5], "optim.betas": (0.9, 0.99), "data.pad_rgb": [1, 2, 3],
        "model.attention.blocks": None, "train.amp": False, "train.max_iters": 7, "optim.lr": 1e-3,
        "data.mask_dir": "", "x": [(1, 2), ["a", "b"], "c"],
    }  # fmt: skip
    with pytest.raises(ConfigError, match="--cfg-options expects key=value, got 'data.root'"):
        parse_cfg_options(["data.root"])
    with pytest.raises(ConfigError, match=r"unbalanced brackets in 'cam.scales=\[1.0, \(2'"):
        parse_cfg_options(["cam.scales=[1.0, (2"])


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The configs tools/train.py would train, without training."""
    seen: list[Config] = []
    monkeypatch.setattr("wsss.engine.train.train", lambda cfg, **kwargs: seen.append(cfg) or pytest.fail("trained"))
    return seen


def test_every_tool_keeps_a_path_with_spaces_as_typed(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("wsss.engine.train.train", lambda cfg, **kw: seen.append(cfg) or SimpleNamespace(is_main=False))
    cfg = tmp_path / "cfg.py"
    cfg.write_text("train = dict(max_iters=3)\n")
    train_cli.main([str(cfg), "--cfg-options", "data.root=/data/my set", "data.classes=[background, my cat]"])
    assert seen[0].data.root == "/data/my set" and seen[0].data.classes == ["background", "my cat"]
    for tool in sorted((REPO / "tools").glob("*.py")):  # one parser for every tool's --cfg-options
        source = tool.read_text()
        if "--cfg-options" in source:
            assert "parse_cfg_options(args.cfg_options)" in source and "DictAction" not in source, tool.name


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_syntax_error_names_the_file_and_line(tmp_path, no_training, capsys):
    base = _write(tmp_path / "base.py", "data = dict(crop_size=64)\n\ntrain = dict(max_iters=3\n")
    child = _write(tmp_path / "cfg.py", "_base_ = ['base.py']\n")
    for path in (base, child):
        with pytest.raises(ConfigError, match=rf"{base} line 3: Python syntax error \('\(' was never closed\)"):
            load_config(path)
    assert train_cli.main([str(child)]) == 2
    assert f"{base} line 3" in _one_error_line(capsys)


def test_base_cycle_is_named(tmp_path, no_training, capsys):
    a = _write(tmp_path / "a.py", "_base_ = 'sub/b.py'\n")
    b = _write(tmp_path / "sub" / "b.py", "_base_ = ['../a.py']\n")
    cycle = f"{a.resolve()} -> {b.resolve()} -> {a.resolve()}"
    with pytest.raises(ConfigError, match=rf"_base_ cycle: {cycle}; remove the _base_ of one of them"):
        load_config(a)
    assert train_cli.main([str(a)]) == 2
    assert "_base_ cycle" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ("notes.txt", "_base_ 'notes.txt' is not a Python config file"),
        ("folder", "_base_ 'folder' is a directory"),
        ("missing.py", "_base_ 'missing.py' not found"),
        ("1", "_base_ must be a file name or a list of file names"),
    ],
)
def test_base_that_is_not_a_config_names_the_file(tmp_path, no_training, capsys, base, message):
    _write(tmp_path / "notes.txt", "hello\n")
    (tmp_path / "folder").mkdir()
    cfg = _write(tmp_path / "cfg.py", f"_base_ = {base!r}\n" if base != "1" else "_base_ = 1\n")
    with pytest.raises((ConfigError, FileNotFoundError), match=rf"{cfg}: {message}"):
        load_config(cfg)
    assert train_cli.main([str(cfg)]) == 2
    assert message in _one_error_line(capsys)


def test_directory_as_config_says_so(tmp_path, no_training, capsys):
    _write(tmp_path / "configs" / "mine.py", "train = dict(max_iters=3)\n")
    with pytest.raises(ConfigError, match=r"configs is a directory, not a config file; give a \.py file in it"):
        load_config(tmp_path / "configs")
    assert train_cli.main([str(tmp_path / "configs")]) == 2
    assert "mine.py" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["data.crop_size=-64"], "config key 'data.crop_size': must be > 0, got -64"),
        (["data.num_workers=-1"], "config key 'data.num_workers': must be >= 0, got -1"),
        (["data.hflip_prob=1.5"], r"config key 'data.hflip_prob': must be in \[0, 1\], got 1.5"),
        (["model.backbone_kwargs.depth=[1]"], r"config key 'model.backbone_kwargs.depth': expected int, got \[1\]"),
        (["model.backbone_kwargs.depth=0"], "config key 'model.backbone_kwargs.depth': must be > 0, got 0"),
        (["model.backbone_kwargs.img_size=[64, x]"], r"config key 'model.backbone_kwargs.img_size'"),
        (["model.backbone_kwargs.dept=2"], "unknown config key 'model.backbone_kwargs.dept'. Did you mean "
                                           "'model.backbone_kwargs.depth'"),
        (["model.backbone_kwargs.checkpoint_path=/etc/hostname"], "model.backbone_kwargs.checkpoint_path"),
        (["model.backbone_kwargs.global_pool=mean"], "'mean' is not one of"),
        (["model.backbone_kwargs.depth=2", "model.attention.blocks=[0,2]"],
         r"config keys 'model.attention.blocks' \(\[0, 2\]\) and 'model.backbone_kwargs.depth' \(2\): block 2 does "
         "not exist"),
    ],
)  # fmt: skip
def test_bad_values_are_named_in_one_line(tmp_path, no_training, capsys, options, message):
    cfg = _write(tmp_path / "cfg.py", "model = dict(aux_layer=-2)\n")
    assert train_cli.main([str(cfg), "--cfg-options", *options]) == 2
    assert re.search(message, _one_error_line(capsys))


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
    assert _one_error_line(capsys) == (
        "error: config keys 'model.aux_layer' (-3) and 'model.backbone_kwargs.depth' (2 for vit_tiny_patch16_224): "
        "block -3 does not exist; set model.aux_layer within [-2, 1] or raise the depth\n"
    )
    assert not (tmp_path / "w" / "config.py").exists()
    default_depth = ModelConfig(backbone="vit_tiny_patch16_224", pretrained="", aux_layer=-13, decoder_channels=8)
    with pytest.raises(ValueError, match=r"'model.aux_layer' \(-13\) and 'model.backbone_kwargs.depth' \(12 for"):
        build_model(default_depth, num_classes=3)
