"""What ``model.backbone_kwargs`` may hold: timm ``VisionTransformer`` arguments, plain values only, each in range."""

from __future__ import annotations

import difflib
from typing import Any

from wsss.config.validation import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    SIDE,
    UNIT,
    ConfigError,
    Range,
    check_range,
    coerce,
    join_key,
)

BACKBONE_KWARGS: dict[str, Any] = {
    "img_size": int | tuple[int, int],
    "patch_size": int,
    "embed_dim": int,
    "depth": int,
    "num_heads": int,
    "mlp_ratio": float,
    "qkv_bias": bool,
    "qk_norm": bool,
    "proj_bias": bool,
    "init_values": float | None,
    "class_token": bool,
    "no_embed_class": bool,
    "reg_tokens": int,
    "pre_norm": bool,
    "final_norm": bool,
    "fc_norm": bool | None,
    "global_pool": ("token", "avg", "max", "avgmax", "map", ""),
    "drop_rate": float,
    "pos_drop_rate": float,
    "patch_drop_rate": float,
    "proj_drop_rate": float,
    "attn_drop_rate": float,
}
"""The ``model.backbone_kwargs`` a config may give (timm ``VisionTransformer`` arguments): each key's type, or its
valid values. Plain values only: no path, layer or callable reaches ``timm.create_model`` from a config or a
checkpoint."""

BACKBONE_RANGES: dict[str, Range] = {
    "img_size": SIDE,
    **dict.fromkeys(("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio"), POSITIVE),
    "init_values": FINITE,
    "reg_tokens": NON_NEGATIVE,
    **dict.fromkeys(("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate"), UNIT),
}
"""The range of each numeric ``model.backbone_kwargs`` value. A checkpoint's sizes are bounded by its stored weights
(:func:`wsss.model_file.check_weights_fit_config`); a config file's are the user's."""


def check_backbone_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``model.backbone_kwargs`` checked against :data:`BACKBONE_KWARGS` (lists become tuples where the type says
    tuple) and :data:`BACKBONE_RANGES`.

    Raises:
        ConfigError: An unknown key, a wrong type or a value out of range; the message names the key.
    """
    section = "model.backbone_kwargs"
    checked = {}
    for name, value in kwargs.items():
        key = join_key(section, name)
        if name not in BACKBONE_KWARGS:
            close = difflib.get_close_matches(str(name), BACKBONE_KWARGS, n=1)
            hint = f" Did you mean '{join_key(section, close[0])}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}'.{hint} Valid keys here: {', '.join(BACKBONE_KWARGS)}")
        spec = BACKBONE_KWARGS[name]
        if isinstance(spec, tuple):
            if value not in spec:
                raise ConfigError(f"config key '{key}': {value!r} is not one of {', '.join(map(repr, spec))}")
            checked[name] = value
        else:
            checked[name] = coerce(spec, value, key)
        if name in BACKBONE_RANGES:
            check_range(key, checked[name], BACKBONE_RANGES[name])
    return checked
