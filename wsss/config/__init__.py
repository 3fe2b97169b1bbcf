"""Typed configuration: mmseg-style Python files validated into dataclasses.

A config file is plain Python (``_base_`` inheritance and ``--cfg-options a.b=v`` overrides as mmseg users know
them, parsed by ``mmengine.Config``), and so it is **code**: loading one runs it with the user's rights, as a script
would (mmengine's convention). Trust a config file as you would trust a script. The config stored in a checkpoint or
an export is **data**: it is read as plain dicts and lists and validated, never executed
(``tests/config/test_embedded_config.py``).

Whatever its source (a file, ``--cfg-options``, a checkpoint), a config is validated into :class:`Config`: unknown
keys, wrong types and out-of-range numbers are refused in one line naming the key, the value and what is allowed.
Every number the pipeline uses lives here, with its range.

- :mod:`wsss.config.schema`: the sections, their defaults and ranges;
- :mod:`wsss.config.validation`: the one validator (types, choices, ranges, the machine's ceilings);
- :mod:`wsss.config.backbone_kwargs`: what ``model.backbone_kwargs`` may hold;
- :mod:`wsss.config.loading`: files, ``_base_``, ``--cfg-options``, the resolved ``config.py``.
"""

from wsss.config.backbone_kwargs import BACKBONE_KWARGS, BACKBONE_RANGES, check_backbone_kwargs
from wsss.config.loading import (
    apply_options,
    check_config_files,
    dump_config,
    load_config,
    parse_cfg_options,
    to_dict,
)
from wsss.config.schema import (
    CRF_BLUR_DIRECTIONS,
    CRF_KERNELS,
    ENERGY_KERNELS,
    FP32_PRECISIONS,
    PAR_KERNELS,
    AttentionConfig,
    CamConfig,
    Config,
    CrfConfig,
    DataConfig,
    GpuCheckConfig,
    InferConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    ParConfig,
    PretrainConfig,
    TrainConfig,
)
from wsss.config.validation import (
    ConfigError,
    check_ignore_index,
    check_mean_std,
    choice,
    fit_workers,
    fits_float,
    from_dict,
)

__all__ = [
    "BACKBONE_KWARGS",
    "BACKBONE_RANGES",
    "CRF_BLUR_DIRECTIONS",
    "CRF_KERNELS",
    "ENERGY_KERNELS",
    "FP32_PRECISIONS",
    "PAR_KERNELS",
    "AttentionConfig",
    "CamConfig",
    "Config",
    "ConfigError",
    "CrfConfig",
    "DataConfig",
    "GpuCheckConfig",
    "InferConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "ParConfig",
    "PretrainConfig",
    "TrainConfig",
    "apply_options",
    "check_backbone_kwargs",
    "check_config_files",
    "check_ignore_index",
    "check_mean_std",
    "choice",
    "dump_config",
    "fit_workers",
    "fits_float",
    "from_dict",
    "load_config",
    "parse_cfg_options",
    "to_dict",
]
