"""tools/train.py takes the flags an mmseg user types (--amp, --launcher, --local-rank) and reports config errors
in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_config
from tools import train as train_cli
from wsss.config import Config, dump_config
from wsss.engine.train import TrainResult


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The configs tools/train.py would train, without training."""
    seen: list[Config] = []

    def fake_train(cfg: Config, **kwargs) -> TrainResult:
        seen.append(cfg)
        return TrainResult(work_dir=Path("w"), checkpoint=None, step=0, model=None)

    monkeypatch.setattr("wsss.engine.train.train", fake_train)  # tools/train.py imports it after parsing
    return seen


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.py"
    dump_config(tiny_config(tmp_path, amp=True), path)
    return path


def test_amp_flags_override_the_config(config_file, captured):
    assert train_cli.main([str(config_file), "--no-amp"]) == 0
    assert train_cli.main([str(config_file), "--amp", "--cfg-options", "train.amp=False"]) == 0
    assert train_cli.main([str(config_file)]) == 0
    assert [cfg.train.amp for cfg in captured] == [False, True, True]


def test_local_rank_spellings_are_accepted(config_file, captured):
    assert train_cli.main([str(config_file), "--local-rank=1"]) == 0
    assert train_cli.main([str(config_file), "--local_rank", "0"]) == 0
    assert len(captured) == 2


def test_launcher_must_match_the_environment(config_file, captured, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert train_cli.main([str(config_file), "--launcher", "none"]) == 0
    assert train_cli.main([str(config_file), "--launcher", "pytorch"]) == 2
    assert "torchrun" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train_cli.main([str(config_file), "--launcher", "none"]) == 2
    assert "--launcher pytorch" in capsys.readouterr().err
    assert len(captured) == 1


def test_config_error_is_one_line_with_the_closest_key(config_file, captured, capsys):
    assert train_cli.main([str(config_file), "--cfg-options", "train.max_iter=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown config key 'train.max_iter'. Did you mean 'train.max_iters'?")
    assert err.count("\n") == 1
    assert train_cli.main([str(config_file.with_name("missing.py"))]) == 2
    assert capsys.readouterr().err.startswith(f"error: config {config_file.with_name('missing.py')} not found")
    assert not captured


def test_unsupported_backbone_stops_before_training(config_file, captured, capsys):
    assert train_cli.main([str(config_file), "--cfg-options", "model.backbone=swin_tiny_patch4_window7_224"]) == 2
    assert "needs a timm VisionTransformer" in capsys.readouterr().err
    assert not captured
