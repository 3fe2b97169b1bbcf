"""A config file is code (mmengine runs it); the config inside a checkpoint or an export is data, never executed.

A crafted model file whose config holds code-like strings, Python expressions for numbers, a ``_base_`` or mmengine's
``custom_imports`` runs nothing: the strings stay strings, everything else is refused naming the key, and the files a
``_base_`` names are never opened."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import mmengine.config
import pytest
import torch

from tests.conftest import tiny_config
from wsss.config import apply_options, dump_config, load_config
from wsss.engine.checkpoint import save_checkpoint
from wsss.inference.exports.deploy import save_safetensors
from wsss.inference.predictor import Segmenter
from wsss.model_file import config_from_checkpoint, read_model_file
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def sentinel(tmp_path) -> Path:
    """A file that any executed piece of the crafted config would create; it must never exist."""
    return tmp_path / "executed"


@pytest.fixture
def evil_base(tmp_path, sentinel) -> Path:
    """A Python config file that creates the sentinel when it is run (as mmengine runs a ``_base_``)."""
    path = tmp_path / "evil_base.py"
    path.write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\ntrain = dict(max_iters=1)\n")
    return path


@pytest.fixture
def no_file_loading(monkeypatch) -> None:
    """Fail the test if mmengine is asked to run a config file."""

    def refuse(*args, **kwargs):
        pytest.fail(f"a config file was run: {args}")

    monkeypatch.setattr(mmengine.config.Config, "fromfile", staticmethod(refuse))


@pytest.fixture
def real(tmp_path) -> dict:
    """The contents of a true checkpoint of the tiny model."""
    cfg = tiny_config(tmp_path)
    path = tmp_path / "real" / "iter_3.pth"
    save_checkpoint(path, build_model(cfg.model, num_classes=3), cfg, ["background", "cat", "dog"], (0.5,) * 3,
                    (0.2,) * 3, 3)  # fmt: skip
    return torch.load(path, weights_only=True)


def write(ckpt: dict, path: Path) -> Path:
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    path.write_bytes(buf.getvalue())
    return path


def code(sentinel: Path) -> dict[str, str]:
    """Strings that create the sentinel if anything evaluates, formats into source or runs them."""
    touch = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    return {
        "expression": touch,
        "statement": f"'); {touch}; ('",  # escapes a naively quoted literal
        "exec": f"exec({touch!r})",
        "placeholder": "{{ " + touch + " }}",  # mmengine's base-variable syntax
    }


def crafted_config(real: dict, sentinel: Path) -> tuple[dict, dict[str, str]]:
    """``real`` with the code-like strings in four string fields of its config; and the strings by field."""
    strings = code(sentinel)
    fields = {"work_dir": strings["expression"], "data.image_dir": strings["statement"],
              "data.mask_dir": strings["exec"], "data.label_file": strings["placeholder"]}  # fmt: skip
    ckpt = copy.deepcopy(real)
    for key, value in fields.items():
        section, _, name = key.rpartition(".")
        (ckpt["config"][section] if section else ckpt["config"])[name] = value
    return ckpt, fields


def values(cfg, keys) -> dict[str, str]:
    """The values of dotted ``keys`` of a Config."""
    out = {}
    for key in keys:
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        out[key] = value
    return out


def test_code_like_strings_in_an_embedded_config_stay_strings(real, tmp_path, sentinel, no_file_loading):
    ckpt, fields = crafted_config(real, sentinel)
    path = write(ckpt, tmp_path / "crafted.pth")
    export = tmp_path / "crafted.safetensors"
    save_safetensors(ckpt, export)
    for source in (path, export):
        segmenter = Segmenter.from_checkpoint(source, "cpu")  # read, checked, the model rebuilt
        assert segmenter.classes == ["background", "cat", "dog"]
        cfg = apply_options(config_from_checkpoint(read_model_file(source)), {"infer.cls_thresh": 0.4}, "infer.")
        assert values(cfg, fields) == fields and cfg.infer.cls_thresh == 0.4  # as tools/infer.py reads it
    assert not sentinel.exists()


def test_a_config_file_written_from_it_keeps_the_strings_as_literals(real, tmp_path, sentinel):
    """The resolved config file (``dump_config``) is Python: loading it runs it, and the strings are still strings."""
    ckpt, fields = crafted_config(real, sentinel)
    cfg = config_from_checkpoint(ckpt)
    dump_config(cfg, tmp_path / "config.py")
    assert load_config(tmp_path / "config.py") == cfg
    assert not sentinel.exists()


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("", "_base_", "EVIL", "unknown config key '_base_'"),
        ("data", "_base_", "EVIL", "unknown config key 'data._base_'"),
        ("", "custom_imports", {"imports": ["evil_module"]}, "unknown config key 'custom_imports'"),
        ("train", "max_iters", "EXPRESSION", "config key 'train.max_iters': expected int, got"),
        ("infer", "scales", "EXPRESSION", "config key 'infer.scales': expected a list, got"),
        ("model", "backbone_kwargs", {"depth": "EXPRESSION"}, "config key 'model.backbone_kwargs.depth': expected int"),
    ],
)
def test_what_a_config_file_could_run_is_refused_in_a_checkpoint(
    real, tmp_path, sentinel, evil_base, no_file_loading, monkeypatch, section, key, value, message
):
    (tmp_path / "evil_module.py").write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # custom_imports would import it from here
    replace = {"EVIL": [str(evil_base)], "EXPRESSION": code(sentinel)["expression"]}
    if isinstance(value, dict):
        value = {k: replace[v] if v in ("EVIL", "EXPRESSION") else v for k, v in value.items()}
    else:
        value = replace[value]
    ckpt = copy.deepcopy(real)
    (ckpt["config"][section] if section else ckpt["config"])[key] = value
    path = write(ckpt, tmp_path / "crafted.pth")
    with pytest.raises(ValueError) as info:
        read_model_file(path)
    assert str(info.value).startswith(f"{path}: its config is refused: {message}") and "\n" not in str(info.value)
    assert not sentinel.exists()
