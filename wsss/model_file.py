"""Model files: a wsss checkpoint (``.pth``, written by training) or a ``tools/export.py --safetensors`` export,
read and turned back into a model for every tool.

- :func:`read_model_file`: either kind, as one checkpoint dict (``model``, ``config``, ``classes``, ``mean``,
  ``std``, ``step``); what every tool that needs only the model calls.
- :func:`load_checkpoint`: a ``.pth`` alone, read with ``torch.load(weights_only=True)`` and checked against its
  ``.sha256`` file (:func:`checksum_path`); training resumes from it (:mod:`wsss.engine.checkpoint`).
- :func:`load_safetensors`: an export alone.
- :func:`model_from_checkpoint`: the model rebuilt from a file or a loaded dict. A model file is data: its config is
  read with the project's own key and type checks (no path reaches timm) and the sizes it states are compared with
  the stored weights (:func:`checked_model_config`), so a crafted file opens nothing and allocates no larger model;
  every number of its config is in range (:mod:`wsss.config.validation`), so it starts no unbounded work.
- :func:`untrained_decoder_warning` and :func:`model_settings_warning`: what a file's model will not do that its user
  may expect (masks from a decoder that has not trained yet; the model settings of a config that are not used).

Every error is one line naming the file; torch's own message (which suggests loading the file unsafely) is never
passed on. This module imports only the config, the models and the utilities, so that the training engine, the
inference and the evaluation all import it and none of them imports another upward.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from wsss.config import Config, ConfigError, check_mean_std, fit_workers, from_dict, to_dict
from wsss.models import build_model

__all__ = [
    "CHECKSUM_SUFFIX",
    "EXPORT_METADATA_KEYS",
    "check_weights_fit_config",
    "checked_model_config",
    "checksum_path",
    "config_from_checkpoint",
    "load_checkpoint",
    "load_safetensors",
    "load_weights",
    "model_from_checkpoint",
    "model_settings_warning",
    "read_model_file",
    "untrained_decoder_warning",
]

CHECKSUM_SUFFIX = ".sha256"
"""``<checkpoint><CHECKSUM_SUFFIX>`` holds the checkpoint's SHA-256 (hex)."""

EXPORT_METADATA_KEYS = ("config", "classes", "mean", "std", "step", "git_commit")
"""The checkpoint entries a safetensors export keeps as JSON in its metadata (beside ``wsss: "1"``)."""

TRAINING_ONLY_MODEL_KEYS = ("pretrained", "load_from", "hub_timeout", "drop_path_rate", "freeze_pos_embed", "head_init")
"""The ``model.*`` settings that only shape training (the start weights, regularisation, what trains): a model
rebuilt from its weights is the same whatever they are."""

_SAFETENSORS_HEADER_START = 8
"""A safetensors file: an 8-byte little-endian header length, then the JSON header (``{`` first)."""


def checksum_path(path: str | Path) -> Path:
    """The checksum file beside checkpoint ``path``."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def read_model_file(path: str | Path) -> dict[str, Any]:
    """A wsss checkpoint (``.pth``) or a ``tools/export.py --safetensors`` export, as a checkpoint dict whose config
    this version reads. An export is recognised by its ``.safetensors`` suffix or, under another name, by its
    header.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is neither, or its config is refused (an unknown key, a wrong type, a value out of
            range; one line naming the file).
    """
    if not _is_safetensors(path):
        return load_checkpoint(path)
    ckpt = load_safetensors(path)
    try:
        config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{path}: its config is refused: {err}") from None
    return ckpt


def _is_safetensors(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix == ".safetensors":
        return True
    try:
        with path.open("rb") as f:
            head = f.read(_SAFETENSORS_HEADER_START + 1)
    except OSError:
        return False
    return len(head) > _SAFETENSORS_HEADER_START and head[_SAFETENSORS_HEADER_START:] == b"{"


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``), checking it against its ``.sha256`` file if present.

    A ``tools/export.py --safetensors`` export is refused here (it holds no training state); the tools that need
    only the model read it with :func:`read_model_file`.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file does not match its checksum, is not a wsss checkpoint (e.g. a bare timm
            state_dict, a pickled module, a safetensors export), or holds a config that is refused.
            One line naming the file; torch's own message (which suggests loading the file unsafely) is never
            passed on.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        raise ValueError(
            f"{path}: a .safetensors export (weights, config and classes, no training state), not a wsss "
            "checkpoint (.pth written by tools/train.py); the tools that need only the model read exports, resuming "
            "a run needs the .pth"
        )
    data = path.read_bytes()
    expected = checksum_path(path).read_text().strip() if checksum_path(path).is_file() else None
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(
            f"{path}: corrupt (its SHA-256 differs from {checksum_path(path).name}; truncated or damaged copy)"
        )
    try:
        ckpt = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # its message advises weights_only=False: never shown
        raise ValueError(
            f"{path}: cannot be read as a checkpoint: not a wsss checkpoint (.pth written by tools/train.py); it "
            "holds more than tensors and plain containers, or is no torch file, and wsss loads nothing else (it "
            "could run code)"
        ) from None
    except Exception as err:  # torch raises several types for empty, truncated or foreign files
        raise ValueError(
            f"{path}: cannot be read as a checkpoint: not a wsss checkpoint (.pth written by tools/train.py); "
            f"empty, truncated or another format ({type(err).__name__})"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(
            f"{path}: not a wsss checkpoint (no model/config). Backbone weights (timm state_dicts) go in "
            "model.pretrained instead."
        )
    try:
        config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{path}: its config is refused: {err}") from None
    return ckpt


def load_safetensors(path: str | Path) -> dict[str, Any]:
    """Read a ``tools/export.py --safetensors`` file (:func:`wsss.inference.exports.deploy.save_safetensors`) as a
    checkpoint dict (``model``, ``config``, ``classes``, ...).

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is not a wsss safetensors export.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path}: cannot be read as safetensors ({err})") from None
    if metadata.get("wsss") != "1":
        raise ValueError(f"{path}: not a wsss export (no config in its metadata); export it with tools/export.py")
    ckpt = {"model": tensors}
    for key in EXPORT_METADATA_KEYS:
        try:
            ckpt[key] = json.loads(metadata[key])
        except (KeyError, ValueError) as err:
            raise ValueError(
                f"{path}: its metadata {key!r} is missing or not JSON ({type(err).__name__}: {err}); export the "
                "checkpoint again with tools/export.py --safetensors"
            ) from None
    return ckpt


def config_from_checkpoint(ckpt: dict[str, Any]) -> Config:
    """The validated config stored in a checkpoint, once its ``mean`` and ``std`` are known to be 3 finite numbers
    each, ``std`` > 0. The config is data: plain dicts and lists, validated (every number in its range), never run.
    Worker counts above this machine's CPUs, set where the file was made, are lowered to them
    (:func:`wsss.config.fit_workers`).

    Raises:
        ConfigError: An unknown key, a wrong type or a value out of its range (one line naming it).
    """
    check_mean_std(ckpt.get("mean"), ckpt.get("std"))
    return from_dict(Config, fit_workers(Config, ckpt["config"]))


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str | Path) -> None:
    """``model.load_state_dict(weights, strict=True)``, with an error naming ``source`` when they do not fit.

    Raises:
        ValueError: Missing, unexpected or differently shaped weights.
    """
    try:
        model.load_state_dict(weights, strict=True)
    except (RuntimeError, KeyError) as err:
        lines = [line.strip().rstrip(". ") for line in str(err).strip().splitlines()]  # torch: a heading, one per kind
        problems = lines[1:] or lines
        raise ValueError(
            f"{source}: its weights do not fit the model its config builds ({'; '.join(problems[:3])}"
            f"{' ...' if len(problems) > 3 else ''}); was the file edited or made by another wsss version?"
        ) from None


def model_from_checkpoint(
    checkpoint: str | Path | dict[str, Any], device: str | torch.device = "cpu", source: str | Path | None = None
):
    """Rebuild the model from a model file alone (a path to a checkpoint or an export, or what
    :func:`read_model_file` returned), in eval mode.

    A model file is data: its config is checked before anything is built (:func:`checked_model_config`), so a
    crafted one opens no file and allocates no model other than the one its stored weights describe.

    Args:
        checkpoint: A path, or a loaded checkpoint.
        device: Where the model goes.
        source: Name used in errors (default: the path, or ``checkpoint``).

    Returns:
        ``(model, ckpt)``: ckpt holds ``config``, ``classes``, ``mean``, ``std``, ``step``.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is no model file, or its config does not build a model its weights fit (the message
            names it).
    """
    source = source or (checkpoint if not isinstance(checkpoint, dict) else "checkpoint")
    ckpt = checkpoint if isinstance(checkpoint, dict) else read_model_file(checkpoint)
    cfg = checked_model_config(ckpt, source)
    model = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    load_weights(model, ckpt["model"], source)
    return model.to(device).eval(), ckpt


def checked_model_config(ckpt: dict[str, Any], source: str | Path) -> Config:
    """The config of a loaded checkpoint, once it is known to build exactly the model its weights describe, with
    ``model.pretrained`` cleared (the checkpoint holds every weight). Nothing is built for real: the stated sizes
    are compared with the stored ones first (:func:`check_weights_fit_config`), then every key and shape with a
    model built on the meta device (no memory).

    Raises:
        ValueError: The config is refused, or does not build a model its weights fit; one line naming ``source``.
    """
    try:
        cfg = config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{source}: its config is refused: {err}") from None
    cfg.model.pretrained = ""
    check_weights_fit_config(ckpt, cfg, source)
    try:
        with torch.device("meta"):
            skeleton = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AssertionError) as err:  # timm asserts too
        raise ValueError(f"{source}: its config does not build a model ({type(err).__name__}: {err})") from None
    _compare_shapes(skeleton, ckpt["model"], source)
    return cfg


_BLOCK = re.compile(r"backbone\.vit\.blocks\.(\d+)\.")
_PATCH_EMBED = "backbone.vit.patch_embed.proj.weight"
_CLASSIFIER = "decoder.cls.weight"


def check_weights_fit_config(ckpt: dict[str, Any], cfg: Config, source: str | Path) -> None:
    """Compare the sizes a checkpoint's config states with its stored weights, before any model is built.

    The backbone's ``embed_dim``, ``depth`` and ``patch_size`` (where ``model.backbone_kwargs`` gives them) and the
    number of classes must be those of the stored tensors, so a rebuilt model is never larger than the weights
    the file holds; what the stored sizes do not state directly is compared on a model built on the meta device
    (:func:`checked_model_config`). The keys and types ``backbone_kwargs`` may hold at all (plain values, never
    a path) are those of :data:`wsss.config.BACKBONE_KWARGS`, checked when the config is read.

    Raises:
        ValueError: A stated size differs from the stored one, or ``model`` is not a wsss state_dict; one line
            naming ``source``.
    """
    weights = ckpt["model"]
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise ValueError(f"{source}: its 'model' is not a state_dict (parameter name -> tensor); not a wsss checkpoint")
    classes = ckpt.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"{source}: its 'classes' is not a list of class names; not a wsss checkpoint")
    patch_embed, classifier = weights.get(_PATCH_EMBED), weights.get(_CLASSIFIER)
    if patch_embed is None or patch_embed.dim() != 4 or classifier is None or classifier.dim() != 4:
        raise ValueError(
            f"{source}: its weights lack the ViT patch embedding or the decoder classifier ({_PATCH_EMBED}, "
            f"{_CLASSIFIER}); not a wsss checkpoint"
        )
    stored = {
        "embed_dim": patch_embed.shape[0],
        "depth": len({int(m.group(1)) for k in weights if (m := _BLOCK.match(k))}),
        "patch_size": patch_embed.shape[-1] if patch_embed.shape[-1] == patch_embed.shape[-2] else None,
    }
    stated = cfg.model.backbone_kwargs
    differ = [
        f"model.backbone_kwargs.{key}={stated[key]!r} but its weights have {value}"
        for key, value in stored.items()
        if key in stated and stated[key] != value
    ]
    if len(classes) != classifier.shape[0]:
        differ.append(f"{len(classes)} classes but its weights predict {classifier.shape[0]}")
    if differ:
        raise ValueError(
            f"{source}: its config states {'; '.join(differ)}; nothing was built (the file was edited or damaged)"
        )


def _compare_shapes(skeleton: torch.nn.Module, weights: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse ``weights`` unless they have exactly the keys and shapes of ``skeleton`` (a meta-device model)."""
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    stored = {k: tuple(v.shape) for k, v in weights.items()}
    problems = [f"missing {k}" for k in expected if k not in stored]
    problems += [f"unexpected {k}" for k in stored if k not in expected]
    problems += [
        f"{k} stored {stored[k]}, built {shape}" for k, shape in expected.items() if k in stored and stored[k] != shape
    ]
    if problems:
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(
            f"{source}: its weights do not fit the model its config builds ({'; '.join(problems[:3])}{more}); "
            "nothing was built; was the file edited or made by another wsss version?"
        )


def untrained_decoder_warning(ckpt: dict[str, Any], source: str | Path) -> str | None:
    """A ``warning: ...`` line when ``ckpt`` was saved before its decoder trained (``step <= loss.seg_start_iter``:
    the segmentation loss weighs 0 on iterations ``0 .. seg_start_iter - 1``), so its masks mean nothing; else None.
    The line names the (0-based) iterations the checkpoint holds and the first one that trains the decoder.
    """
    step, start = ckpt.get("step"), config_from_checkpoint(ckpt).loss.seg_start_iter
    if not isinstance(step, int) or step > start:
        return None
    held = {0: "no iteration", 1: "iteration 0"}.get(step, f"iterations 0-{step - 1}")
    return (
        f"warning: {source} holds {held} (saved at step {step}); its decoder trains from iteration {start} on "
        f"(loss.seg_start_iter = {start}, 0-based), so no iteration it holds trained the decoder and its masks mean "
        f"nothing; use a checkpoint saved at step {start + 1} or later, or its CAMs (tools/infer.py --cams, "
        "tools/eval_cams.py)"
    )


def model_settings_warning(cfg: Config, ckpt: dict[str, Any], source: str | Path) -> str | None:
    """A ``warning: ...`` line naming each ``model.*`` setting of ``cfg`` that differs from the one ``ckpt`` was
    trained with (the model is rebuilt from the checkpoint, so ``cfg``'s are not used), or None when they agree.
    The settings of :data:`TRAINING_ONLY_MODEL_KEYS` are not compared."""
    ours, theirs = (_flat(to_dict(c)["model"], "model") for c in (cfg, config_from_checkpoint(ckpt)))
    ignored = tuple(f"model.{key}" for key in TRAINING_ONLY_MODEL_KEYS)
    differ = [
        f"{key} {ours.get(key)!r} in the config, {theirs.get(key)!r} in the checkpoint"
        for key in sorted(ours.keys() | theirs.keys())
        if not key.startswith(ignored) and ours.get(key) != theirs.get(key)
    ]
    if not differ:
        return None
    return (
        f"warning: the config's model settings differ from those {source} was trained with, and the model is rebuilt "
        f"from the checkpoint's: {'; '.join(differ)}"
    )


def _flat(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"PREFIX.a.b": 1}``."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        out.update(_flat(value, name) if isinstance(value, dict) else {name: value})
    return out
