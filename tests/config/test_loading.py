"""Config files, ``_base_`` and ``--cfg-options``: loaded as mmseg loads them, every mistake in one line."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.config.conftest import one_error_line, write_file
from tools import train as train_cli
from wsss.config import ConfigError, dump_config, load_config, parse_cfg_options

REPO = Path(__file__).resolve().parents[2]


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


def test_unknown_key_in_file_and_missing_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("train = dict(max_iterz=3)\n")
    with pytest.raises(ConfigError, match="train.max_iterz"):
        load_config(bad)
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config(tmp_path / "nope.py")


def test_train_cli_reports_config_errors_in_one_line(tmp_path, capsys):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("train = dict(max_iters=3)\n")
    assert train_cli.main([str(cfg), "--work-dir", str(tmp_path / "w"), "--cfg-options", "train.ckpt_interval=0"]) == 2
    assert capsys.readouterr().err == "error: config key 'train.ckpt_interval': must be > 0, got 0\n"
    assert train_cli.main([str(tmp_path / "nope.py")]) == 2
    assert capsys.readouterr().err.startswith(f"error: config {tmp_path / 'nope.py'} not found")


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


def test_every_tool_keeps_a_path_with_spaces_as_typed(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("wsss.engine.train.train", lambda cfg, **kw: seen.append(cfg) or SimpleNamespace(is_main=False))
    cfg = tmp_path / "cfg.py"
    cfg.write_text("train = dict(max_iters=3)\n")
    train_cli.main([str(cfg), "--cfg-options", "data.root=/data/my set", "data.classes=[background, my cat]"])
    assert seen[0].data.root == "/data/my set" and seen[0].data.classes == ["background", "my cat"]
    passed_on = {"reproduce.py": REPO / "wsss" / "reproduce.py"}  # hands them to its stages, parsed there first
    for tool in sorted((REPO / "tools").glob("*.py")):  # one parser for every tool's --cfg-options
        source = tool.read_text()
        if "--cfg-options" in source and tool.name in passed_on:
            assert "parse_cfg_options(options)" in passed_on[tool.name].read_text() and "DictAction" not in source
        elif "--cfg-options" in source:
            assert "parse_cfg_options(args.cfg_options)" in source and "DictAction" not in source, tool.name


def test_syntax_error_names_the_file_and_line(tmp_path, no_training, capsys):
    base = write_file(tmp_path / "base.py", "data = dict(crop_size=64)\n\ntrain = dict(max_iters=3\n")
    child = write_file(tmp_path / "cfg.py", "_base_ = ['base.py']\n")
    for path in (base, child):
        with pytest.raises(ConfigError, match=rf"{base} line 3: Python syntax error \('\(' was never closed\)"):
            load_config(path)
    assert train_cli.main([str(child)]) == 2
    assert f"{base} line 3" in one_error_line(capsys)


def test_base_cycle_is_named(tmp_path, no_training, capsys):
    a = write_file(tmp_path / "a.py", "_base_ = 'sub/b.py'\n")
    b = write_file(tmp_path / "sub" / "b.py", "_base_ = ['../a.py']\n")
    cycle = f"{a.resolve()} -> {b.resolve()} -> {a.resolve()}"
    with pytest.raises(ConfigError, match=rf"_base_ cycle: {cycle}; remove the _base_ of one of them"):
        load_config(a)
    assert train_cli.main([str(a)]) == 2
    assert "_base_ cycle" in one_error_line(capsys)


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
    write_file(tmp_path / "notes.txt", "hello\n")
    (tmp_path / "folder").mkdir()
    cfg = write_file(tmp_path / "cfg.py", f"_base_ = {base!r}\n" if base != "1" else "_base_ = 1\n")
    with pytest.raises((ConfigError, FileNotFoundError), match=rf"{cfg}: {message}"):
        load_config(cfg)
    assert train_cli.main([str(cfg)]) == 2
    assert message in one_error_line(capsys)


def test_directory_as_config_says_so(tmp_path, no_training, capsys):
    write_file(tmp_path / "configs" / "mine.py", "train = dict(max_iters=3)\n")
    with pytest.raises(ConfigError, match=r"configs is a directory, not a config file; give a \.py file in it"):
        load_config(tmp_path / "configs")
    assert train_cli.main([str(tmp_path / "configs")]) == 2
    assert "mine.py" in one_error_line(capsys)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["data.crop_size=-64"], r"config key 'data.crop_size': must be in \[1, 2048\] \(ceiling 2048 px.*\), got -64"),
        (["data.num_workers=-1"], r"config key 'data.num_workers': must be in \[0, \d+\] \(at most .*\), got -1"),
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
    cfg = write_file(tmp_path / "cfg.py", "model = dict(aux_layer=-2)\n")
    assert train_cli.main([str(cfg), "--cfg-options", *options]) == 2
    assert re.search(message, one_error_line(capsys))
