"""Builders: config dataclasses in, models out (the models themselves take plain keyword arguments); a built model
started from another's weights for fine-tuning (:func:`load_initial_weights`, ``model.load_from``).

``wsss.models`` never imports :mod:`wsss.config`; the builders read the config objects' attributes, so any
object with the fields of :class:`wsss.config.ModelConfig` / :class:`wsss.config.AttentionConfig` works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from wsss.models.backbone import ViTBackbone, build_backbone
from wsss.models.segmentor import WSSSModel
from wsss.models.variants import get_variant

if TYPE_CHECKING:  # annotations only: no import of wsss.config at run time
    from wsss.config import AttentionConfig, ModelConfig

__all__ = ["CLASS_HEADS", "attention_args", "build_model", "build_model_backbone", "load_initial_weights"]

CLASS_HEADS = ("classifier", "aux_classifier", "decoder.cls")
"""The layers of :class:`~wsss.models.segmentor.WSSSModel` with one output per class: the final and auxiliary
classifiers and the decoder's last 1x1 conv."""


def attention_args(cfg: AttentionConfig) -> dict[str, Any]:
    """:func:`~wsss.models.backbone.build_backbone`'s ``attention``, ``attention_blocks`` and
    ``attention_kwargs`` (the fields the variant declares in ``config_fields``) from an attention config."""
    return {
        "attention": cfg.name,
        "attention_blocks": cfg.blocks,
        "attention_kwargs": {field: getattr(cfg, field) for field in get_variant(cfg.name).config_fields},
    }


def build_model_backbone(cfg: ModelConfig) -> ViTBackbone:
    """The backbone that ``cfg`` describes; with ``cfg.freeze_pos_embed`` its position embedding does not train."""
    backbone = build_backbone(
        cfg.backbone,
        pretrained=cfg.pretrained,
        drop_path_rate=cfg.drop_path_rate,
        backbone_kwargs=cfg.backbone_kwargs,
        hub_timeout=cfg.hub_timeout,
        pos_embed_interp=cfg.pos_embed_interp,
        **attention_args(cfg.attention),
    )
    if cfg.freeze_pos_embed and backbone.vit.pos_embed is not None:
        backbone.vit.pos_embed.requires_grad_(False)
    return backbone


def build_model(cfg: ModelConfig, num_classes: int) -> WSSSModel:
    """The model that ``cfg`` describes, for ``num_classes`` classes (background included)."""
    backbone = build_model_backbone(cfg)
    if not -backbone.depth <= cfg.aux_layer < backbone.depth:
        raise ValueError(
            f"config keys 'model.aux_layer' ({cfg.aux_layer}) and 'model.backbone_kwargs.depth' ({backbone.depth} "
            f"for {cfg.backbone}): block {cfg.aux_layer} does not exist; set model.aux_layer within "
            f"[{-backbone.depth}, {backbone.depth - 1}] or raise the depth"
        )
    return WSSSModel(
        backbone,
        num_classes,
        aux_layer=cfg.aux_layer,
        decoder_channels=cfg.decoder_channels,
        decoder_dilation=cfg.decoder_dilation,
        kaiming_init=cfg.head_init == "kaiming",
    )


def load_initial_weights(model: WSSSModel, weights: Mapping[str, torch.Tensor], same_classes: bool) -> list[str]:
    """Start ``model`` (just built) from ``weights``, another :class:`WSSSModel`'s state_dict, for fine-tuning.

    With ``same_classes`` (the same class names, in order) every weight is loaded. Otherwise each layer of
    :data:`CLASS_HEADS` keeps the initialisation ``model`` was built with (a fresh model's) and the rest is loaded.

    Returns:
        The names of the class heads left at their fresh initialisation (empty with ``same_classes``).

    Raises:
        ValueError: A weight to load is missing, unexpected or of another shape (another architecture); the
            message lists the first three differences.
    """
    fresh = [] if same_classes else list(CLASS_HEADS)
    prefixes = tuple(f"{name}." for name in fresh)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(prefixes)}
    given = {k: v for k, v in weights.items() if not k.startswith(prefixes)}
    problems = [f"{k} missing" for k in own if k not in given]
    problems += [f"{k} unexpected" for k in given if k not in own]
    problems += [
        f"{k} {tuple(v.shape)} in the file, {tuple(own[k].shape)} here"
        for k, v in given.items()
        if k in own and v.shape != own[k].shape
    ]
    if problems:
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(f"{'; '.join(problems[:3])}{more}")
    model.load_state_dict(given, strict=False)
    return fresh
