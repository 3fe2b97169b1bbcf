"""Every number of a config is range-checked by one validator, from a config file, from ``--cfg-options`` and from the
config inside a checkpoint alike (issue 31, section 2): refused in one line naming the key, the value and the range."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import typing
from pathlib import Path

import pytest
import torch

from tests.config.conftest import one_error_line
from tests.conftest import tiny_config
from tools import infer as infer_cli
from tools import make_pseudo_labels as pseudo_cli
from wsss.config import Config, ConfigError, from_dict, load_config, parse_cfg_options
from wsss.engine.checkpoint import save_checkpoint
from wsss.inference.exports.deploy import save_safetensors
from wsss.model_file import config_from_checkpoint, read_model_file
from wsss.models import build_model

NAN, INF = float("nan"), float("inf")
CEILING_REASON = r" \(ceiling .*\)"

# (key, value, as typed after --cfg-options KEY=, the error after "config key"); the value is the one a file or a
# checkpoint holds, the text the one a user types.
BAD_VALUES = [
    ("cam.fg_thresh", NAN, "nan", r" 'cam\.fg_thresh': must be in \[0, 1\], got nan"),
    ("cam.bg_thresh", NAN, "nan", r" 'cam\.bg_thresh': must be in \[0, 1\], got nan"),
    ("cam.bg_thresh", 0.8, "0.8", r"s 'cam\.bg_thresh' \(0\.8\) and 'cam\.fg_thresh' \(0\.7\): bg_thresh must be <="),
    ("cam.scales", [-1.0], "[-1]", r" 'cam\.scales\[0\]': must be in \(0, 4\]" + CEILING_REASON + ", got -1.0"),
    ("infer.cls_thresh", NAN, "nan", r" 'infer\.cls_thresh': must be in \[0, 1\], got nan"),
    ("infer.cls_thresh", -1.0, "-1", r" 'infer\.cls_thresh': must be in \[0, 1\], got -1\.0"),
    ("par.num_iter", -1, "-1", r" 'par\.num_iter': must be in \[0, 100\]" + CEILING_REASON + ", got -1"),
    ("par.num_iter", 10**9, "1000000000", r" 'par\.num_iter': must be in \[0, 100\]" + CEILING_REASON + ", got 10+$"),
    ("infer.crf.iterations", -1, "-1", r" 'infer\.crf\.iterations': must be in \[0, 100\]" + CEILING_REASON),
    ("data.scale_range", [2.0, 0.5], "(2.0, 0.5)", r" 'data\.scale_range': the first value must be <= the second"),
    ("data.scale_range", [-1.0, -0.5], "[-1,-0.5]", r" 'data\.scale_range\[0\]': must be in \(0, 4\]"),
    ("train.val_max_images", -3, "-3", r" 'train\.val_max_images': must be > 0, got -3"),
    ("optim.lr", INF, "inf", r" 'optim\.lr': must be finite and > 0, got inf"),
    ("loss.reg_sigma_rgb", 0.0, "0", r" 'loss\.reg_sigma_rgb': must be finite and > 0, got 0\.0"),
    ("infer.crf.bilateral_sxy", 0.0, "0", r" 'infer\.crf\.bilateral_sxy': must be finite and > 0, got 0\.0"),
    ("infer.crf.blur_directions", 4, "4", r" 'infer\.crf\.blur_directions': must be in \[1, 3\] \(the kernel's "
     r"ceiling\), got 4"),
    ("data.ignore_index", 300, "300", r" 'data\.ignore_index': must be in \[0, 255\], got 300"),
    ("data.ignore_index", 5, "5", r" 'data\.ignore_index': must be in \[21, 255\] \(.*no class index.*\), got 5"),
    ("infer.scales", [20.0], "[20]", r" 'infer\.scales\[0\]': must be in \(0, 4\]" + CEILING_REASON + ", got 20.0"),
    ("infer.scales", [1.0, 2.5], "[1, 2.5]", r"s 'infer\.max_size' \(1024\) and 'infer\.scales' \(\[1\.0, 2\.5\]\): "
     r".* 2560 px, above the ceiling of 2048 px"),
    ("infer.scales", [], "[]", r" 'infer\.scales': must hold 1 to 16 values, got 0"),
    ("infer.crf.workers", 10**6, "1000000", r" 'infer\.crf\.workers': must be in \[0, \d+\] \(at most max\(2, "
     r"os\.cpu_count\(\)\) = \d+ on this machine\), got 1000000"),
    ("infer.max_size", -1, "-1", r" 'infer\.max_size': must be >= 0, got -1"),
    ("par.dilations", [1, 0], "[1,0]", r" 'par\.dilations\[1\]': must be in \[1, 256\]" + CEILING_REASON),
    ("par.dilations", [1] * 17, f"[{','.join(['1'] * 17)}]", r" 'par\.dilations': must hold 1 to 16 values, got 17"),
    ("cam.scales", [1.0] * 17, f"[{','.join(['1'] * 17)}]", r" 'cam\.scales': must hold 1 to 16 values, got 17"),
    ("model.drop_path_rate", 1.0, "1", r" 'model\.drop_path_rate': must be in \[0, 1\), got 1\.0"),
    ("gpu_check.ddp_resume_from", 30, "30", r" 'gpu_check\.ddp_resume_from': must be in \[1, 29\], got 30"),
    ("data.color_jitter", [0.4, 0.4, 0.2, 0.6], "[0.4,0.4,0.2,0.6]",
     r" 'data\.color_jitter\[3\]': must be in \[0, 0\.5\] \(hue: half the hue circle\), got 0\.6"),
]  # fmt: skip
IDS = [f"{key}={text}" for key, _, text, _ in BAD_VALUES]


def nested(key: str, value: typing.Any) -> dict:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    *parents, name = key.split(".")
    out = {name: value}
    for parent in reversed(parents):
        out = {parent: out}
    return out


def python_literal(value: typing.Any) -> str:
    """Python source of a config value, infinities and NaN included."""
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={python_literal(v)}" for k, v in value.items()) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(map(python_literal, value)) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


def config_file(path: Path, key: str, value: typing.Any) -> Path:
    """A config file that sets ``key`` to ``value``, written to ``path``."""
    path.write_text("".join(f"{name} = {python_literal(section)}\n" for name, section in nested(key, value).items()))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> dict:
    """The contents of a true checkpoint of the tiny model, as the project's save function writes it."""
    folder = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(folder)
    path = folder / "iter_3.pth"
    classes = ["background", "cat", "dog"]
    save_checkpoint(path, build_model(cfg.model, num_classes=3), cfg, classes, (0.5,) * 3, (0.2,) * 3, 3)
    return torch.load(path, weights_only=True)


def craft(ckpt: dict, path: Path, key: str | None = None, value: typing.Any = None, **entries) -> Path:
    """``ckpt`` with config ``key`` set to ``value`` and top-level ``entries`` replaced, written to ``path``."""
    ckpt = {**copy.deepcopy(ckpt), **entries}
    if key is not None:
        *parents, name = key.split(".")
        section = ckpt["config"]
        for parent in parents:
            section = section[parent]
        section[name] = value
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize(("key", "value", "text", "message"), BAD_VALUES, ids=IDS)
def test_refused_from_a_config_file(tmp_path, key, value, text, message):
    with pytest.raises(ConfigError) as info:
        load_config(config_file(tmp_path / "cfg.py", key, value))
    assert "\n" not in str(info.value)
    assert info.match("^config key" + message)


@pytest.mark.parametrize(("key", "value", "text", "message"), BAD_VALUES, ids=IDS)
def test_refused_from_cfg_options(tmp_path, key, value, text, message):
    path = tmp_path / "cfg.py"
    path.write_text("train = dict(max_iters=3)\n")
    with pytest.raises(ConfigError, match="^config key" + message):
        load_config(path, parse_cfg_options([f"{key}={text}"]))


FITTED = {"infer.crf.workers=1000000"}
"""Refused from a config file, lowered to this machine's CPUs in a checkpoint (see the test after the next)."""


@pytest.mark.parametrize(
    ("key", "value", "text", "message"),
    [bad for bad, name in zip(BAD_VALUES, IDS, strict=True) if name not in FITTED],
    ids=[name for name in IDS if name not in FITTED],
)
def test_refused_from_a_checkpoints_or_an_exports_config(checkpoint, tmp_path, key, value, text, message):
    if key == "data.ignore_index" and value == 5:  # the tiny model's classes are a file: the dataset checks them
        checkpoint = {**checkpoint, "config": {**checkpoint["config"], "data": {**checkpoint["config"]["data"]}}}
        checkpoint["config"]["data"]["classes"] = [f"c{k}" for k in range(21)]
    path = craft(checkpoint, tmp_path / "crafted.pth", key, value)
    export = tmp_path / "crafted.safetensors"
    save_safetensors(torch.load(path, weights_only=True), export)
    for source in (path, export):
        with pytest.raises(ValueError) as info:
            read_model_file(source)
        assert "\n" not in str(info.value)
        assert info.match(f"^{source}: its config is refused: config key" + message)


HUGE = 10**400
"""An integer too large for a float: ``math.isfinite`` raised OverflowError on it (issue 38, section 3)."""
HUGE_SAID = r"got an integer of 401 digits \(above 1\.79769e\+308, the largest float\)$"
HUGE_VALUES = [
    ("par.num_iter", HUGE, r"'par\.num_iter': must be in \[0, 100\]" + CEILING_REASON),
    ("infer.crf.iterations", HUGE, r"'infer\.crf\.iterations': must be in \[0, 100\]" + CEILING_REASON),
    ("par.dilations", [1, HUGE], r"'par\.dilations\[1\]': must be in \[1, 256\]" + CEILING_REASON),
    ("par.w1", HUGE, r"'par\.w1': expected a number a float can hold,"),
    ("model.backbone_kwargs", {"mlp_ratio": HUGE}, r"'model\.backbone_kwargs\.mlp_ratio': expected a number a float"),
]


@pytest.mark.parametrize("source", ["config file", "--cfg-options", "checkpoint", "export"])
@pytest.mark.parametrize(("key", "value", "message"), HUGE_VALUES, ids=[key for key, _, _ in HUGE_VALUES])
def test_an_integer_too_large_for_a_float_is_refused_in_one_line(checkpoint, tmp_path, source, key, value, message):
    expected = f"config key {message}.* {HUGE_SAID}"
    if source == "config file":
        with pytest.raises(ConfigError, match=f"^{expected}"):
            load_config(config_file(tmp_path / "cfg.py", key, value))
    elif source == "--cfg-options":
        path = tmp_path / "cfg.py"
        path.write_text("train = dict(max_iters=3)\n")
        option = f"{key}.mlp_ratio={HUGE}" if isinstance(value, dict) else f"{key}={str(value).replace(' ', '')}"
        with pytest.raises(ConfigError, match=f"^{expected}"):
            load_config(path, parse_cfg_options([option]))
    else:
        crafted = craft(checkpoint, tmp_path / "crafted.pth", key, value)
        if source == "export":
            crafted = tmp_path / "crafted.safetensors"
            save_safetensors(torch.load(tmp_path / "crafted.pth", weights_only=True), crafted)
        with pytest.raises(ValueError, match=f"^{crafted}: its config is refused: {expected}"):
            read_model_file(crafted)


@pytest.mark.parametrize(
    "key", ["gaussian_sxy", "bilateral_sxy", "bilateral_srgb", "gaussian_compat", "bilateral_compat"]
)
def test_every_crf_constant_is_finite_widths_positive_weights_not_negative(key):
    """A zero width divided the CRF's features (a BrokenProcessPool); a weight of 0 switches its kernel off."""
    width = key.endswith(("sxy", "srgb"))
    for value in (0.0 if width else -1.0, INF):
        rule = "finite and > 0" if width else "finite and >= 0"
        with pytest.raises(ConfigError, match=rf"^config key 'infer\.crf\.{key}': must be {rule}, got"):
            from_dict(Config, {"infer": {"crf": {key: value}}})
    assert getattr(from_dict(Config, {"infer": {"crf": {key: 1e-3 if width else 0.0}}}).infer.crf, key) >= 0


def test_the_true_checkpoint_is_read(checkpoint, tmp_path):
    """The control of the test above: the same checkpoint, unedited, is read."""
    assert read_model_file(craft(checkpoint, tmp_path / "iter_3.pth"))["step"] == 3


def test_a_checkpoint_made_on_a_larger_machine_loads_with_this_machines_workers(checkpoint, tmp_path):
    """Worker counts are the machine's, not the model's: 8 loaders chosen on a 16-core node must not lock the
    checkpoint out of a 2-core laptop, where ``--cfg-options`` cannot reach the embedded config before its check.
    The same values in a config file stay refused (``test_refused_from_a_config_file``)."""
    from wsss.config.validation import CPU_LIMIT

    ckpt = copy.deepcopy(checkpoint)
    ckpt["config"]["data"]["num_workers"] = CPU_LIMIT + 6
    ckpt["config"]["infer"]["crf"]["workers"] = CPU_LIMIT + 1
    ckpt["config"]["infer"]["crf"]["iterations"] = 7  # a neighbour of the fitted key, kept as written
    cfg = config_from_checkpoint(read_model_file(craft(ckpt, tmp_path / "big.pth")))
    assert (cfg.data.num_workers, cfg.infer.crf.workers, cfg.infer.crf.iterations) == (CPU_LIMIT, CPU_LIMIT, 7)
    small = craft(checkpoint, tmp_path / "small.pth", "infer.crf.workers", 1)
    assert config_from_checkpoint(read_model_file(small)).infer.crf.workers == 1  # below the ceiling: untouched
    with pytest.raises(ConfigError, match=r"'data\.num_workers': must be in \[0, "):
        from_dict(Config, ckpt["config"])


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"mean": [NAN, 0.5, 0.5]}, r"checkpoint 'mean\[0\]': must be finite, got nan"),
        ({"std": [0.2, 0.0, 0.2]}, r"checkpoint 'std\[1\]': must be finite and > 0, got 0\.0"),
        ({"std": [0.2, 0.2, -INF]}, r"checkpoint 'std\[2\]': must be finite and > 0, got -inf"),
        ({"std": [0.2, 0.2]}, r"checkpoint 'std': expected 3 numbers \(R, G, B\), got \[0\.2, 0\.2\]"),
        ({"mean": None}, r"checkpoint 'mean': expected 3 numbers \(R, G, B\), got None"),
        ({"mean": [0.5, HUGE, 0.5]}, r"checkpoint 'mean\[1\]': must be finite, " + HUGE_SAID[:-1]),
    ],
)
def test_a_checkpoints_mean_and_std_are_finite_and_std_positive(checkpoint, tmp_path, entries, message):
    path = craft(checkpoint, tmp_path / "crafted.pth", **entries)
    with pytest.raises(ValueError, match=f"^{path}: its config is refused: {message}$"):
        read_model_file(path)


def test_infer_refuses_a_checkpoint_with_unbounded_scales_in_one_line(checkpoint, tmp_path, capsys):
    """The issue's case: ``infer.scales=[20]`` in a checkpoint ran for minutes and ignored SIGTERM."""
    path = craft(checkpoint, tmp_path / "crafted.pth", "infer.scales", [20.0])
    (tmp_path / "photos").mkdir()
    assert infer_cli.main([str(path), str(tmp_path / "photos"), str(tmp_path / "out"), "--no-progress"]) == 2
    assert "config key 'infer.scales[0]': must be in (0, 4]" in one_error_line(capsys)
    true = craft(checkpoint, tmp_path / "true.pth")
    argv = [str(true), str(tmp_path / "photos"), str(tmp_path / "out"), "--cfg-options", "infer.crf.workers=1000000"]
    assert infer_cli.main(argv) == 2
    assert "config key 'infer.crf.workers': must be in [0, " in one_error_line(capsys)


@pytest.mark.parametrize("where", ["checkpoint", "--cfg-options"])
def test_pseudo_labels_refuse_endless_par_before_starting(checkpoint, tmp_path, capsys, where):
    """``par.num_iter=10**9`` ran without end; it is refused before the dataset is even opened."""
    out = tmp_path / "out"
    if where == "checkpoint":
        argv = [str(craft(checkpoint, tmp_path / "crafted.pth", "par.num_iter", 10**9)), str(out)]
    else:
        argv = [str(craft(checkpoint, tmp_path / "true.pth")), str(out), "--cfg-options", "par.num_iter=1000000000"]
    assert pseudo_cli.main([*argv, "--device", "cpu", "--no-progress"]) == 2
    assert "config key 'par.num_iter': must be in [0, 100] (ceiling 100" in one_error_line(capsys)
    assert not out.exists()


def _fields(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field, typing.Any]]:
    """``(dotted key, field, type)`` of every leaf field of a config dataclass."""
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        key = f"{prefix}{spec.name}"
        if dataclasses.is_dataclass(hints[spec.name]):
            yield from _fields(hints[spec.name], key + ".")
        else:
            yield key, spec, hints[spec.name]


def _numbers_in(tp: typing.Any) -> set[type]:
    """The numeric types (int, float) a type hint admits, at any depth."""
    if tp in (int, float):
        return {tp}
    return set().union(*(_numbers_in(arg) for arg in typing.get_args(tp) if arg is not Ellipsis))


UNRANGED = {
    "model.aux_layer": "a block index, checked against the depth when the model is built",
    "model.attention.blocks": "block indices, checked against model.backbone_kwargs.depth",
}


def test_every_number_of_every_section_has_a_range():
    from wsss.config import BACKBONE_KWARGS, BACKBONE_RANGES

    missing = [
        key
        for key, spec, tp in _fields(Config)
        if _numbers_in(tp) and "range" not in spec.metadata and key not in UNRANGED and key != "model.backbone_kwargs"
    ]
    assert missing == []
    numeric_kwargs = {name for name, tp in BACKBONE_KWARGS.items() if not isinstance(tp, tuple) and _numbers_in(tp)}
    assert numeric_kwargs - set(BACKBONE_RANGES) == set()


def _real_fields() -> list[tuple[str, typing.Any]]:
    """Every ranged float field, with a value of its shape."""
    out = []
    for key, spec, tp in _fields(Config):
        if "range" in spec.metadata and float in _numbers_in(tp):
            default = spec.default
            out.append((key, [0.0] * len(default) if isinstance(default, tuple) else 0.0))
    return out


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize(("key", "shape"), _real_fields(), ids=[key for key, _ in _real_fields()])
def test_nan_and_infinities_fail_every_range(key, shape, bad):
    value = [bad] * len(shape) if isinstance(shape, list) else bad
    with pytest.raises(ConfigError, match=rf"^config keys? '{key}(\[0\])?'.*got .*{bad}"):
        from_dict(Config, nested(key, value))


def test_the_ends_of_the_ranges_are_accepted():
    from wsss.config.validation import CPU_LIMIT

    edges = {
        "cam": {"fg_thresh": 0.5, "bg_thresh": 0.5},  # no ignored band: allowed
        "par": {"num_iter": 100, "dilations": [256]},
        "data": {"scale_range": [4, 4], "ignore_index": 21, "num_workers": CPU_LIMIT},
        "infer": {"max_size": 1024, "scales": [2.0], "crf": {"iterations": 100, "workers": CPU_LIMIT}},
        "train": {"val_max_images": 1},
        "model": {"drop_path_rate": 0.999},
        "gpu_check": {"ddp_iters": 30, "ddp_resume_from": 29},
    }
    cfg = from_dict(Config, edges)
    assert cfg.infer.crf.workers == CPU_LIMIT and cfg.cam.bg_thresh == cfg.cam.fg_thresh
    assert from_dict(Config, {"infer": {"max_size": 0, "scales": [4.0]}}).infer.scales == (4.0,)  # 0: no cap, opted out
    assert from_dict(Config, {"data": {"classes": None, "ignore_index": 1}}).data.ignore_index == 1  # checked later
    sixteen = {"cam": {"scales": [4.0] * 16}, "infer": {"scales": [2.0] * 16}, "par": {"dilations": [256] * 16},
               "data": {"color_jitter": [1.0, 1.0, 1.0, 0.5]}}  # fmt: skip
    cfg = from_dict(Config, sixteen)  # the messages say "1 to 16 values" and "hue ... [0, 0.5]"
    assert len(cfg.cam.scales) == len(cfg.infer.scales) == len(cfg.par.dilations) == 16
    assert cfg.data.color_jitter[3] == 0.5


def test_ignore_index_colliding_with_a_class_of_a_classes_file_is_refused_by_the_dataset(tiny_voc):
    from wsss.data.voc import VOCClsDataset

    cfg = tiny_config(tiny_voc).data  # classes.txt: 3 classes
    cfg.ignore_index = 2
    with pytest.raises(ConfigError, match=r"'data\.ignore_index': must be in \[3, 255\] .*, got 2"):
        VOCClsDataset(cfg, (0.5,) * 3, (0.2,) * 3, split="train")
