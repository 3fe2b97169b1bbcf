"""wsss.model_file: one reader for every model file, importable from every layer without an arrow running back up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import wsss
from tests.conftest import TINY_CLASSES, tiny_config
from wsss.config import to_dict
from wsss.data.transforms import backbone_mean_std
from wsss.engine.checkpoint import save_checkpoint
from wsss.inference.exports.deploy import save_safetensors
from wsss.model_file import load_checkpoint, model_from_checkpoint, read_model_file, untrained_decoder_warning
from wsss.models import build_model

PACKAGE = Path(wsss.__file__).parent


def imported_modules(path: Path, module: str) -> list[str]:
    """The absolute names of the modules that ``path`` (module ``module``) imports: ``import a.b``,
    ``from a.b import c`` -> ``a.b``, ``a.b.c``; relative imports resolved."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = module.split(".")[: -node.level] if node.level else []
            base = ".".join([*package, *([node.module] if node.module else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return names


def upward_imports(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """``file: module`` for every import of ``files`` that names one of the ``forbidden`` packages or modules."""
    return [
        f"{path.name}: {name}"
        for path in files
        for name in imported_modules(path, ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if any(name == f or name.startswith(f"{f}.") for f in forbidden)
    ]


def test_imported_modules_sees_every_spelling(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import wsss.engine.checkpoint\nfrom wsss.engine import step\nfrom ..engine import train\n")
    assert imported_modules(source, "wsss.inference.m") == [
        "wsss.engine.checkpoint", "wsss.engine", "wsss.engine.step", "wsss.engine", "wsss.engine.train",
    ]  # fmt: skip


@pytest.mark.parametrize("layer", ["inference", "evaluation"])
def test_inference_and_evaluation_never_import_the_training_engine(layer):
    files = sorted((PACKAGE / layer).glob("*.py"))
    assert files
    assert upward_imports(files, ("wsss.engine",)) == []


def test_model_file_imports_only_lower_layers():
    forbidden = ("wsss.engine", "wsss.inference", "wsss.evaluation", "wsss.analysis", "wsss.gpu_check", "tools")
    assert upward_imports([PACKAGE / "model_file.py"], forbidden) == []


@pytest.fixture
def model_files(tiny_voc, tmp_path):
    """(checkpoint, its safetensors export) of an untrained tiny model."""
    cfg = tiny_config(tiny_voc)
    torch.manual_seed(0)
    ckpt = tmp_path / "iter_0.pth"
    mean, std = backbone_mean_std(cfg.model.backbone)
    save_checkpoint(ckpt, build_model(cfg.model, num_classes=3), cfg, TINY_CLASSES, mean, std, step=0)
    export = tmp_path / "model.safetensors"
    save_safetensors(load_checkpoint(ckpt), export)
    return ckpt, export


def test_every_model_file_gives_the_same_model(model_files, tmp_path):
    ckpt, export = model_files
    renamed = tmp_path / "model.bin"  # an export under another name is known by its header
    renamed.write_bytes(export.read_bytes())
    reference, _ = model_from_checkpoint(ckpt)
    for path in (export, renamed):
        data = read_model_file(path)
        assert data["classes"] == read_model_file(ckpt)["classes"] and "optimizer" not in data
        model, _ = model_from_checkpoint(path)
        for (name, a), (_, b) in zip(reference.state_dict().items(), model.state_dict().items(), strict=True):
            assert torch.equal(a, b), name


def test_a_missing_or_foreign_model_file_is_named(model_files, tmp_path):
    ckpt, export = model_files
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        read_model_file(tmp_path / "missing.safetensors")
    with pytest.raises(
        ValueError, match=r"model\.safetensors: a \.safetensors export .* resuming a run needs the \.pth"
    ):
        load_checkpoint(export)  # training state is read from a .pth only
    fake = tmp_path / "fake.safetensors"
    fake.write_bytes(b"not safetensors at all")
    with pytest.raises(ValueError, match=r"^\S*fake\.safetensors: cannot be read as safetensors"):
        read_model_file(fake)


@pytest.mark.parametrize(("step", "held"), [(0, "no iteration"), (1, "iteration 0"), (5, "iterations 0-4")])
def test_the_untrained_decoder_warning_names_the_iterations_held_and_the_first_that_trains_it(step, held):
    """"saved at iteration 2, before its decoder trained (from loss.seg_start_iter = 2 on)" read as a contradiction:
    the line now says which (0-based) iterations the checkpoint holds and from which one the decoder trains."""
    cfg = to_dict(tiny_config("data"))
    cfg["loss"]["seg_start_iter"] = 5
    ckpt = {"step": step, "config": cfg, "mean": [0.5] * 3, "std": [0.2] * 3}
    assert untrained_decoder_warning(ckpt, "c.pth") == (
        f"warning: c.pth holds {held} (saved at step {step}); its decoder trains from iteration 5 on "
        "(loss.seg_start_iter = 5, 0-based), so no iteration it holds trained the decoder and its masks mean nothing; "
        "use a checkpoint saved at step 6 or later, or its CAMs (tools/infer.py --cams, tools/eval_cams.py)"
    )
    assert untrained_decoder_warning({**ckpt, "step": 6}, "c.pth") is None  # iteration 5 trained it
