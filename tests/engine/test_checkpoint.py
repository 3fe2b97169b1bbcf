"""Checkpoint integrity: no non-finite weights saved, checksums, fallback to the previous valid checkpoint, weights
that do not fit the model refused by every loader (inference, export, resume), naming the key."""

from __future__ import annotations

import errno
import os
import pickle

import pytest
import torch

from tests.conftest import tiny_config
from tests.engine.test_crafted_checkpoint import craft
from wsss.engine.checkpoint import (
    LAST_CHECKPOINT,
    NonFiniteWeightsError,
    load_resume_checkpoint,
    save_checkpoint,
)
from wsss.engine.optim import build_optimizer
from wsss.engine.resume import find_checkpoint, restore_training_state
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.train import train
from wsss.inference.exports.deploy import save_safetensors
from wsss.inference.predictor import Segmenter
from wsss.model_file import checksum_path, load_checkpoint, model_from_checkpoint, read_model_file
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
    with pytest.raises(ValueError, match="alien.pth: its config is refused: unknown config key 'model.no_such_key'"):
        load_checkpoint(work / "alien.pth")


WEIGHT_EDITS = {
    "missing": "backbone.vit.blocks.1.attn.proj.weight",  # strict=False would leave this layer random
    "unexpected": "decoder.conv3.weight",
}
"""A key dropped from or added to a checkpoint's weights (the config and every other tensor unchanged)."""


def edit_weights(ckpt: dict, edit: str) -> dict:
    """``ckpt`` with the key of ``WEIGHT_EDITS[edit]`` dropped from (or added to) its weights."""
    weights = dict(ckpt["model"])
    if edit == "missing":
        del weights[WEIGHT_EDITS[edit]]
    else:
        weights[WEIGHT_EDITS[edit]] = torch.ones(16, 16, 1, 1)
    return {**ckpt, "model": weights}


def assert_names_the_key(err: pytest.ExceptionInfo, path, edit: str) -> None:
    message = str(err.value)
    assert message.startswith(f"{path}: its weights do not fit the model its config builds"), message
    assert edit in message.lower() and WEIGHT_EDITS[edit] in message and "\n" not in message, message


@pytest.mark.parametrize("edit", list(WEIGHT_EDITS))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_inference_refuses_a_missing_or_unexpected_weight(saved, edit, suffix):
    """A checkpoint (valid checksum) or an export with one weight too few or too many is refused, naming the key,
    where inference, evaluation and export rebuild the model: never loaded with the layer left random."""
    _, _, work = saved
    ckpt = edit_weights(load_checkpoint(work / "iter_6.pth"), edit)
    if suffix == ".pth":
        path = craft(ckpt, work / "edited.pth")
    else:
        path = work / "edited.safetensors"
        save_safetensors(ckpt, path)
    for load in (lambda: model_from_checkpoint(read_model_file(path), source=path),
                 lambda: Segmenter.from_checkpoint(path, "cpu")):  # fmt: skip
        with pytest.raises(ValueError) as err:
            load()
        assert_names_the_key(err, path, edit)


def training_state(cfg):
    """Model, optimiser and scheduler built from ``cfg`` as the training loop builds them."""
    model = build_model(cfg.model, num_classes=3)
    optimizer, o = build_optimizer(model, cfg.optim), cfg.optim
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
    return model, optimizer, scheduler


@pytest.mark.parametrize("edit", list(WEIGHT_EDITS))
def test_resume_refuses_a_missing_or_unexpected_weight(saved, edit):
    """Resuming loads the weights into the model the current config builds: one too few or too many is an error
    naming the key, never a run that trains on with a layer re-initialised."""
    cfg, _, work = saved
    model, optimizer, scheduler = training_state(cfg)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # AdamW moments to resume
    save_checkpoint(work / "iter_9.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 9, optimizer, scheduler)
    found, ckpt = find_checkpoint(work, True)
    assert restore_training_state(ckpt, found, *training_state(cfg), ["bg", "a", "b"]) == 9  # unedited: resumes
    path = craft(edit_weights(ckpt, edit), work / "edited.pth")
    found, ckpt = find_checkpoint(work, path)
    with pytest.raises(ValueError) as err:
        restore_training_state(ckpt, found, *training_state(cfg), ["bg", "a", "b"])
    assert_names_the_key(err, path, edit)


class _Evil:
    """Unpickling it would run a shell command that creates a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _malicious_files(folder, marker, good):
    """Five ways to smuggle code into a checkpoint file."""
    evil = _Evil(marker)
    files = {
        "torch_save": {"model": {}, "config": {}, "payload": evil},
        "in_state_dict": {**good, "model": {**good["model"], "x": evil}},
        "legacy_format": {"model": {}, "config": {}, "payload": evil},
    }
    paths = []
    for name, obj in files.items():
        path = folder / f"{name}.pth"
        torch.save(obj, path, _use_new_zipfile_serialization=name != "legacy_format")
        paths.append(path)
    (folder / "raw_pickle.pth").write_bytes(pickle.dumps(evil))
    paths.append(folder / "raw_pickle.pth")
    (folder / "eval_global.pth").write_bytes(b"cbuiltins\neval\n(Vopen(" + repr(str(marker)).encode() + b", 'w')\ntR.")
    paths.append(folder / "eval_global.pth")
    return paths


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickles_are_refused_and_run_nothing(saved, tmp_path):
    _, _, work = saved
    marker = tmp_path / "pwned"
    good = torch.load(work / "iter_6.pth", weights_only=True)
    for path in _malicious_files(tmp_path, marker, good):
        with pytest.raises(ValueError, match=f"{path.name}: cannot be read as a checkpoint"):
            load_checkpoint(path)
        with pytest.raises(ValueError):
            model_from_checkpoint(path)
    assert not marker.exists()
    pickle.loads(pickle.dumps(_Evil(marker)))  # the payloads do work when unpickled unsafely
    assert marker.exists()


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_checkpoint_write_keeps_the_previous_one(saved, monkeypatch, fault):
    """A full disk or an interrupt while the new checkpoint is flushed: the old one and the marker stay."""
    cfg, model, work = saved
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    real_fsync = os.fsync

    def failing_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and ".pth." in os.readlink(f"/proc/self/fd/{fd}"):
            raise fault
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(type(fault)):
        save_checkpoint(work / "iter_9.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 9)
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in work.iterdir()}
    assert not (work / "iter_9.pth").exists() and not [n for n in after if n.endswith(".tmp")]
    assert {n: after[n] for n in before} == before  # the old checkpoints, their checksums, the marker
    assert load_resume_checkpoint(work)[0] == work / "iter_6.pth"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_unreadable_files_give_one_line_without_torchs_unsafe_hint(saved, tmp_path):
    from safetensors.torch import save_file

    _, _, work = saved
    good = torch.load(work / "iter_6.pth", weights_only=True)
    save_file({"w": torch.zeros(2)}, tmp_path / "weights.safetensors")
    (tmp_path / "empty.pth").write_bytes(b"")
    paths = [*_malicious_files(tmp_path, tmp_path / "pwned", good), tmp_path / "weights.safetensors",
             tmp_path / "empty.pth"]  # fmt: skip
    for path in paths:
        with pytest.raises(ValueError) as info:
            load_checkpoint(path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message and "weights_only" not in message, message
        assert "not a wsss checkpoint (.pth written by tools/train.py)" in message
