"""Checkpoint integrity: no non-finite weights saved, checksums, fallback to the previous valid checkpoint."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config
from wsss.engine.checkpoint import (
    LAST_CHECKPOINT,
    NonFiniteWeightsError,
    checksum_path,
    load_checkpoint,
    load_resume_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from wsss.engine.train import train
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def saved(tiny_voc, tmp_path):
    """A tiny model saved at steps 3 and 6 in a work dir: (cfg, model, work dir)."""
    cfg = tiny_config(tiny_voc)
    model = build_model(cfg.model, num_classes=3)
    work = tmp_path / "w"
    for step in (3, 6):
        save_checkpoint(work / f"iter_{step}.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, step)
    return cfg, model, work


def test_non_finite_weights_are_never_saved(saved):
    cfg, model, work = saved
    before = (work / "iter_6.pth").read_bytes()
    with torch.no_grad():
        next(model.parameters())[0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match="iter_9.pth.*1 weight tensor"):
        save_checkpoint(work / "iter_9.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 9)
    assert not (work / "iter_9.pth").exists() and not checksum_path(work / "iter_9.pth").exists()
    assert (work / LAST_CHECKPOINT).read_text().strip() == "iter_6.pth"
    assert (work / "iter_6.pth").read_bytes() == before


def test_a_bit_flip_is_caught_by_the_checksum(saved):
    _, _, work = saved
    path = work / "iter_6.pth"
    assert checksum_path(path).read_text().strip()
    data = bytearray(path.read_bytes())
    tensor_bytes = data.rfind(b"data/0") + 200  # inside a stored tensor: torch.load alone does not notice
    data[tensor_bytes] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="iter_6.pth: corrupt"):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_resume_falls_back_to_the_previous_valid_checkpoint(saved, damage, capsys):
    _, _, work = saved
    path = work / "iter_6.pth"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-300] + bytes([data[-300] ^ 1]) + data[-299:])
    else:
        path.unlink()
    found, ckpt = load_resume_checkpoint(work)
    assert found == work / "iter_3.pth" and ckpt["step"] == 3
    assert "not resuming from" in capsys.readouterr().err


def test_resume_without_marker_finds_the_newest_checkpoint(saved):
    _, _, work = saved
    (work / LAST_CHECKPOINT).unlink()
    assert load_resume_checkpoint(work)[0] == work / "iter_6.pth"
    for p in work.glob("iter_*.pth"):
        p.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="none of its checkpoints is valid"):
        load_resume_checkpoint(work)
    assert load_resume_checkpoint(work / "empty") is None


def test_training_resumes_from_the_last_valid_checkpoint(tiny_voc, tmp_path, capsys):
    work = tmp_path / "w"
    train(tiny_config(tiny_voc), work_dir=work, device="cpu")
    (work / "iter_6.pth").write_bytes((work / "iter_6.pth").read_bytes()[:1000])
    res = train(tiny_config(tiny_voc, max_iters=7), work_dir=work, resume=True, device="cpu")
    assert res.step == 7
    assert f"resuming from {work / 'iter_3.pth'} at iteration 3" in capsys.readouterr().out


def test_config_that_does_not_fit_the_weights_names_the_file(saved):
    cfg, model, work = saved
    cfg.model.decoder_channels = 8
    save_checkpoint(work / "edited.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 6)
    with pytest.raises(ValueError, match="edited.pth: its weights do not fit"):
        model_from_checkpoint(work / "edited.pth")
    ckpt = torch.load(work / "iter_6.pth", weights_only=True)
    ckpt["config"]["model"]["no_such_key"] = 1
    torch.save(ckpt, work / "alien.pth")
    with pytest.raises(ValueError, match="alien.pth: its config does not fit"):
        load_checkpoint(work / "alien.pth")
