"""Fine-tuning from a checkpoint (``model.load_from``): a new run starts from a wsss checkpoint's or export's weights,
not its optimiser, schedule or iteration; other classes start the class heads afresh; ``model.pretrained`` given a
wsss checkpoint points to ``model.load_from``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from wsss.config import Config
from wsss.data.labels import labels_from_masks, save_labels
from wsss.data.toy.dataset import make_toy_voc
from wsss.data.toy.render import TOY_CLASSES
from wsss.engine.train import train
from wsss.inference.exports.deploy import save_safetensors
from wsss.model_file import load_checkpoint
from wsss.models import backbone as backbone_module
from wsss.models import build_model
from wsss.models.builder import CLASS_HEADS

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCE_ITERS = 40


def with_model(cfg: Config, **model) -> Config:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model))


def toy_config(root: Path, max_iters: int, **model) -> Config:
    """The tiny model on the toy set, validated at its last iteration, without stochastic depth (so that a tiny
    learning rate leaves the validation of the weights it starts from unchanged)."""
    cfg = tiny_config(root, max_iters=max_iters, ckpt_interval=max_iters, val_interval=max_iters,
                      log_interval=max_iters)  # fmt: skip
    return with_model(cfg, drop_path_rate=0.0, head_init="kaiming", **model)


def frozen(cfg: Config) -> Config:
    """``cfg`` for one iteration at a learning rate that cannot move a weight measurably."""
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=1e-12))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """A tiny ViT trained for SOURCE_ITERS iterations on the toy set: its root, checkpoint, export and val metrics."""
    base = tmp_path_factory.mktemp("load_from")
    root = make_toy_voc(base / "toy", num_train=8, num_val=4)
    save_labels(root / "cls_labels.json", labels_from_masks(root / "SegmentationClass", len(TOY_CLASSES)),
                list(TOY_CLASSES))  # fmt: skip
    cfg = toy_config(root, SOURCE_ITERS)
    cfg.optim.lr = 2e-3
    result = train(cfg, work_dir=base / "work", device="cpu")
    export = base / "model.safetensors"
    save_safetensors(load_checkpoint(result.checkpoint), export)
    return {"root": root, "checkpoint": result.checkpoint, "export": export, "val": result.val.metrics}


@pytest.mark.parametrize("kind", ["checkpoint", "export"])
def test_fine_tuning_starts_from_the_source_val_miou(source, tmp_path, monkeypatch, kind):
    """Same classes: every weight is kept, so the first validation (after one iteration at lr 1e-12) gives the
    source's mIoU, while the same run without load_from is far lower. The iteration, the optimiser and the
    schedule start afresh, and model.pretrained ("hub") is never fetched: the file holds every weight."""
    monkeypatch.setattr(backbone_module, "hub_reachable", lambda timeout: pytest.fail("the hub was asked"))
    cfg = frozen(toy_config(source["root"], 1, pretrained="hub", load_from=str(source[kind])))
    result = train(cfg, work_dir=tmp_path / "tuned", device="cpu")
    for name, value in source["val"].items():
        assert result.val.metrics[name] == pytest.approx(value, abs=0.05), name
    assert result.step == 1 and result.checkpoint == tmp_path / "tuned" / "iter_1.pth"
    state = load_checkpoint(result.checkpoint)
    assert state["step"] == 1 and state["scheduler"]["last_epoch"] == 1
    assert all(int(s["step"]) == 1 for s in state["optimizer"]["state"].values())  # fresh AdamW moments
    log = (tmp_path / "tuned" / "log.txt").read_text()
    assert f"weights from {source[kind]}" in log and "every weight kept" in log, log

    fresh = train(frozen(toy_config(source["root"], 1, pretrained="")), work_dir=tmp_path / "fresh", device="cpu")
    assert fresh.val.metrics["seg_mIoU"] < source["val"]["seg_mIoU"] - 10.0


def test_other_classes_start_the_class_heads_afresh(source, tiny_voc, tmp_path):
    """A toy-set checkpoint fine-tuned on cat/dog: the backbone and the decoder's hidden layers are loaded, the class
    heads are those of a fresh model, and the start of the run names them."""
    cfg = frozen(with_model(tiny_config(tiny_voc, max_iters=1, ckpt_interval=1), drop_path_rate=0.0,
                            head_init="kaiming", load_from=str(source["checkpoint"])))  # fmt: skip
    result = train(cfg, work_dir=tmp_path / "w", device="cpu")
    tuned = load_checkpoint(result.checkpoint)["model"]
    loaded = load_checkpoint(source["checkpoint"])["model"]
    torch.manual_seed(cfg.train.seed)
    fresh = build_model(with_model(cfg, load_from="").model, num_classes=3).state_dict()
    heads = [k for k in tuned if k.startswith(tuple(f"{h}." for h in CLASS_HEADS))]
    assert sorted(heads) == ["aux_classifier.conv.weight", "classifier.conv.weight", "decoder.cls.weight"]
    for k, v in tuned.items():
        expected = fresh[k] if k in heads else loaded[k]
        assert torch.allclose(v, expected, atol=1e-6), k
    log = (tmp_path / "w" / "log.txt").read_text()
    assert "re-initialised classifier, aux_classifier, decoder.cls" in log, log


def test_another_architecture_is_one_line_naming_the_file(source, tmp_path):
    cfg = toy_config(source["root"], 1, load_from=str(source["checkpoint"]))
    cfg.model.backbone_kwargs = {**cfg.model.backbone_kwargs, "embed_dim": 48}
    with pytest.raises(ValueError) as err:
        train(cfg, work_dir=tmp_path / "w", device="cpu")
    message = str(err.value)
    assert "\n" not in message and str(source["checkpoint"]) in message, message
    assert "model.backbone_kwargs.embed_dim" in message and "32" in message and "48" in message, message
    assert not (tmp_path / "w" / "iter_1.pth").exists()


def test_resume_takes_precedence_over_load_from(source, tiny_voc, tmp_path):
    """A resumed run holds every weight in its own checkpoint: load_from is ignored, and the log says so."""
    work = tmp_path / "w"
    cfg = tiny_config(tiny_voc, max_iters=2, ckpt_interval=2)
    train(cfg, work_dir=work, device="cpu")
    resumed = train(with_model(tiny_config(tiny_voc, max_iters=4, ckpt_interval=2), load_from=str(source["export"])),
                    work_dir=work, resume=True, device="cpu")  # fmt: skip
    uninterrupted = train(tiny_config(tiny_voc, max_iters=4, ckpt_interval=2), work_dir=tmp_path / "u", device="cpu")
    a, b = load_checkpoint(resumed.checkpoint)["model"], load_checkpoint(uninterrupted.checkpoint)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert f"model.load_from ({source['export']}) is ignored: resuming" in (work / "log.txt").read_text()


@pytest.mark.parametrize("kind", ["checkpoint", "export"])
def test_pretrained_given_a_wsss_model_file_points_to_load_from(source, kind):
    cfg = toy_config(source["root"], 1, pretrained=str(source[kind]))
    with pytest.raises(ValueError) as err:
        build_model(cfg.model, num_classes=len(TOY_CLASSES))
    message = str(err.value)
    assert "\n" not in message and str(source[kind]) in message, message
    assert f"model.load_from={source[kind]}" in message and "missing keys" not in message, message


@pytest.mark.parametrize("change", ["reordered", "renamed"])
def test_the_same_number_of_other_classes_starts_the_class_heads_afresh(source, tmp_path, change):
    """A checkpoint whose classes are as many as the run's but in another order or with another name: its class
    heads' rows mean other classes, so they start afresh (the rest is loaded), and the log names them."""
    state = load_checkpoint(source["checkpoint"])
    classes = list(TOY_CLASSES)
    state["classes"] = [classes[0], *classes[:0:-1]] if change == "reordered" else [*classes[:-1], "something"]
    assert len(state["classes"]) == len(classes) and state["classes"] != classes
    other = tmp_path / "other_classes.pth"
    torch.save(state, other)
    cfg = frozen(toy_config(source["root"], 1, load_from=str(other)))
    result = train(cfg, work_dir=tmp_path / "w", device="cpu")
    tuned = load_checkpoint(result.checkpoint)["model"]
    torch.manual_seed(cfg.train.seed)
    fresh = build_model(with_model(cfg, load_from="").model, num_classes=len(classes)).state_dict()
    heads = [k for k in tuned if k.startswith(tuple(f"{h}." for h in CLASS_HEADS))]
    assert len(heads) == 3
    for k, v in tuned.items():
        expected = fresh[k] if k in heads else state["model"][k]
        assert torch.allclose(v, expected, atol=1e-6), k
    assert "re-initialised classifier, aux_classifier, decoder.cls" in (tmp_path / "w" / "log.txt").read_text()
