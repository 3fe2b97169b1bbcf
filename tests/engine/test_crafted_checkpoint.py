"""A checkpoint is data, not instructions: a crafted config inside a checkpoint with a valid checksum opens no path and
allocates no model bigger than the stored weights; it is refused, naming the file, before timm builds anything."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import tiny_config
from tools import export as export_cli
from wsss.engine.checkpoint import save_checkpoint
from wsss.inference.exports.deploy import save_safetensors
from wsss.inference.predictor import Segmenter
from wsss.model_file import checksum_path, model_from_checkpoint
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["background", "cat", "dog"]
TINY_SIZES = {"depth": 3, "embed_dim": 32, "patch_size": 8}
"""The sizes of :func:`tests.conftest.tiny_config`'s backbone."""


@pytest.fixture
def real(tiny_voc, tmp_path) -> dict:
    """The contents of a checkpoint of the tiny model, written by the project's save function."""
    cfg = tiny_config(tiny_voc)
    path = tmp_path / "real" / "iter_3.pth"
    save_checkpoint(path, build_model(cfg.model, num_classes=3), cfg, CLASSES, (0.5,) * 3, (0.2,) * 3, 3)
    return torch.load(path, weights_only=True)


def craft(ckpt: dict, path: Path, **backbone_kwargs) -> Path:
    """``ckpt`` with ``backbone_kwargs`` put into its config, written as a checkpoint with a matching .sha256."""
    ckpt = {**ckpt, "config": {**ckpt["config"], "model": dict(ckpt["config"]["model"])}}
    ckpt["config"]["model"]["backbone_kwargs"] = {**ckpt["config"]["model"]["backbone_kwargs"], **backbone_kwargs}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    checksum_path(path).write_text(hashlib.sha256(buf.getvalue()).hexdigest() + "\n")
    return path


@pytest.fixture
def create_model_calls(monkeypatch) -> list[dict]:
    """Every ``timm.create_model`` call from now on, with its device; the real function runs only on the meta device
    or for the tiny model, so that a crafted size never allocates here even where the checks are missing."""
    calls, real_create = [], timm.create_model

    def spy(*args, **kwargs):
        device = torch.empty(0).device.type
        calls.append({"args": args, "kwargs": kwargs, "device": device})
        tiny = {k: v for k, v in kwargs.items() if k in ("embed_dim", "depth", "patch_size")} == TINY_SIZES
        if device != "meta" and not tiny:
            pytest.fail(f"timm.create_model called on {device} with {kwargs}")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    return calls


def rebuild_everywhere(path: Path, tmp_path: Path, capsys) -> list[str]:
    """The messages of every way a checkpoint is rebuilt: the library, the predictor, tools/export.py."""
    messages = []
    for rebuild in (lambda: model_from_checkpoint(path), lambda: Segmenter.from_checkpoint(path, "cpu")):
        with pytest.raises(ValueError) as info:
            rebuild()
        messages.append(str(info.value))
    capsys.readouterr()
    assert export_cli.main([str(path), "--safetensors", str(tmp_path / "out.safetensors")]) == 2
    messages.append(capsys.readouterr().err.strip().removeprefix("error: "))
    assert not (tmp_path / "out.safetensors").exists()
    return messages


@pytest.mark.parametrize("key", ["checkpoint_path", "pretrained_cfg_overlay"])
def test_a_path_in_backbone_kwargs_is_refused_unopened(real, tmp_path, key, create_model_calls, capsys):
    sentinel = tmp_path / "sentinel.pth"  # does not exist: timm reading it would fail differently
    value = str(sentinel) if key == "checkpoint_path" else {"file": str(sentinel)}
    path = craft(real, tmp_path / "crafted.pth", **{key: value})
    for message in rebuild_everywhere(path, tmp_path, capsys):
        assert message.startswith(f"{path}: ") and f"model.backbone_kwargs.{key}" in message, message
        assert "\n" not in message
    assert create_model_calls == [] and not sentinel.exists()


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"embed_dim": 24576, "num_heads": 2}, "embed_dim=24576"),  # 7 GB at deit-s depth
        ({"depth": 10**6}, "depth=1000000"),
        ({"patch_size": 1}, "patch_size=1"),
    ],
)
def test_sizes_other_than_the_stored_weights_are_refused_before_building(
    real, tmp_path, edit, named, create_model_calls, capsys
):
    path = craft(real, tmp_path / "crafted.pth", **edit)
    for message in rebuild_everywhere(path, tmp_path, capsys):
        assert message.startswith(f"{path}: ") and named in message and "its weights" in message, message
    assert create_model_calls == []


def test_other_classes_than_the_stored_heads_are_refused_before_building(real, tmp_path, create_model_calls):
    path = craft({**real, "classes": [*CLASSES, *(f"c{k}" for k in range(500))]}, tmp_path / "crafted.pth")
    with pytest.raises(ValueError, match=r"crafted.pth: .*503 classes.* 3"):
        model_from_checkpoint(path)
    assert create_model_calls == []


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("model", "decoder_channels", 2048),
        ("backbone_kwargs", "img_size", 2048),
        ("backbone_kwargs", "mlp_ratio", 64.0),
    ],
)
def test_every_other_difference_is_found_on_the_meta_device(real, tmp_path, section, key, value, create_model_calls):
    """What the stored sizes do not state directly is compared with a model built on the meta device (no memory);
    the model is built for real only when every stored tensor fits it."""
    ckpt = {**real, "config": {**real["config"], "model": dict(real["config"]["model"])}}
    if section == "model":
        ckpt["config"]["model"][key] = value
        path = craft(ckpt, tmp_path / "crafted.pth")
    else:
        path = craft(ckpt, tmp_path / "crafted.pth", **{key: value})
    with pytest.raises(ValueError, match=r"crafted.pth: its weights do not fit the model its config builds"):
        model_from_checkpoint(path)
    assert [c["device"] for c in create_model_calls] == ["meta"]


def test_a_true_checkpoint_and_its_export_still_rebuild(real, tmp_path, create_model_calls):
    path = craft(real, tmp_path / "iter_3.pth")
    model, _ = model_from_checkpoint(path)
    assert [c["device"] for c in create_model_calls] == ["meta", "cpu"]
    export = tmp_path / "model.safetensors"
    save_safetensors(real, export)
    rebuilt = Segmenter.from_checkpoint(export, "cpu").model
    for (name, a), b in zip(model.state_dict().items(), rebuilt.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(model.state_dict()["decoder.cls.weight"], real["model"]["decoder.cls.weight"])


def test_a_crafted_export_is_named_too(real, tmp_path, create_model_calls):
    ckpt = {**real, "config": {**real["config"], "model": dict(real["config"]["model"])}}
    ckpt["config"]["model"]["backbone_kwargs"] = {**ckpt["config"]["model"]["backbone_kwargs"], "embed_dim": 24576}
    export = tmp_path / "crafted.safetensors"
    save_safetensors(ckpt, export)
    with pytest.raises(ValueError, match=rf"^{export}: .*embed_dim=24576"):
        Segmenter.from_checkpoint(export, "cpu")
    ckpt["config"]["model"]["backbone_kwargs"]["checkpoint_path"] = "/etc/hostname"
    save_safetensors(ckpt, export)
    with pytest.raises(ValueError, match=rf"^{export}: .*checkpoint_path"):
        Segmenter.from_checkpoint(export, "cpu")
    assert create_model_calls == []
