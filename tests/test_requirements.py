"""The declared requirements are true: the installed timm is in range and has the internals the attention
variants use, one package owns cv2, and ``pip install .`` reads the same lists as ``make install``."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import timm
import torch
from packaging.requirements import Requirement
from setuptools.config.pyprojecttoml import read_configuration
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

ROOT = Path(__file__).resolve().parents[1]


def requirements(name: str) -> dict[str, Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: r for r in reqs}


def test_timm_in_declared_range_with_an_upper_bound() -> None:
    spec = requirements("requirements.txt")["timm"].specifier
    assert timm.__version__ in spec
    assert "1.0.27" not in spec  # the last release without Attention.gate
    assert "1.1.0" not in spec  # the variants subclass timm internals: a new minor must be tested first


def test_torch_floor_is_the_measured_one() -> None:
    """2.4 is the oldest torch whose `make test-fast` passes (README); GPU images carrying 2.11 must be admitted."""
    reqs = requirements("requirements.txt")
    spec = reqs["torch"].specifier
    assert torch.__version__.split("+")[0] in spec
    assert "2.4.0" in spec and "2.11.0" in spec and "2.3.1" not in spec
    assert "0.19.0" in reqs["torchvision"].specifier and "0.18.1" not in reqs["torchvision"].specifier


def test_timm_attention_internals_the_variants_use() -> None:
    """wsss.models.attention.VariantAttention builds timm's Attention with these arguments and reads these
    attributes; a timm release that renames one breaks every variant."""
    attn = Attention(16, num_heads=2, attn_head_dim=4, dim_out=12, qkv_bias=True, proj_bias=False)
    for name in ("qkv", "q_norm", "k_norm", "norm", "proj", "attn_drop", "proj_drop", "gate"):
        assert hasattr(attn, name), name
    assert (attn.num_heads, attn.head_dim, attn.attn_dim, attn.scale) == (2, 4, 8, 4**-0.5)
    assert attn.gate is None and isinstance(attn.fused_attn, bool)
    assert (attn.qkv.in_features, attn.qkv.out_features, attn.proj.out_features) == (16, 24, 12)
    vit = VisionTransformer(img_size=32, patch_size=16, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    assert type(vit.blocks[0].attn) is Attention
    assert hasattr(vit, "forward_intermediates") and vit.num_prefix_tokens == 1
    assert vit.patch_embed.dynamic_feat_size((48, 32)) == (3, 2)
    assert vit(torch.zeros(1, 3, 32, 32)).shape == (1, 16)


def test_one_package_owns_cv2() -> None:
    """opencv-python and opencv-python-headless both install cv2/; `make install` keeps only the headless one."""
    owners = []
    for dist in ("opencv-python", "opencv-python-headless", "opencv-contrib-python"):
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        owners.append(dist)
    assert owners == ["opencv-python-headless"], f"{owners}: run `make install` again"


def test_pip_install_reads_the_requirement_files() -> None:
    """What setuptools builds `pip install .` from: requirements.txt as dependencies, the dev tools as an extra."""
    project = read_configuration(ROOT / "pyproject.toml", expand=True)["project"]
    runtime, dev = requirements("requirements.txt"), requirements("requirements-dev.txt")
    assert [Requirement(r).name for r in project["dependencies"]] == list(runtime)
    assert [Requirement(r).name for r in project["optional_dependencies"]["dev"]] == list(dev)
    assert {"pytest", "ruff"} <= dev.keys() and not {"pytest", "ruff"} & runtime.keys()
    assert {"torch", "timm", "mmengine", "mmsegmentation", "ftfy", "regex"} <= runtime.keys()
