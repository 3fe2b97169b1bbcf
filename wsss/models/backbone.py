"""The ViT backbone: a timm VisionTransformer with an attention variant swapped into chosen blocks.

Built with ``timm.create_model(..., dynamic_img_size=True, dynamic_img_pad=True, num_classes=0)``, so any
input size works: the position embedding is resampled to the input grid at every forward, and a size that
is not a multiple of the patch size is zero-padded on the right and bottom by timm's patch embedding (the
token grid is then ``ceil(H / p) x ceil(W / p)`` and covers the padded image).

The position-embedding grid is resampled with ``pos_embed_interp``: ``bicubic`` is the reference's (ToCo's
``F.interpolate(..., mode="bicubic", align_corners=False)``, no antialiasing), ``timm`` is timm's own
``resample_abs_pos_embed`` (bicubic with antialiasing, a different kernel even when upsampling).

Pretrained weights are loaded into the plain timm model before the swap, so timm checkpoints load with
strict key matching and the parameters a variant adds (GFSA weights, ContraNorm LayerNorms) keep their
neutral initialisation.
"""

from __future__ import annotations

import socket
import types
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlparse

import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.models import clean_state_dict
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from wsss.models.attention import FirstValues, link_first_values
from wsss.models.variants import get_variant

__all__ = [
    "BackboneOutput",
    "POS_EMBED_INTERP",
    "PretrainedUnavailableError",
    "ViTBackbone",
    "apply_attention_variant",
    "build_backbone",
    "create_vit",
    "load_timm_checkpoint",
    "require_vision_transformer",
    "resample_pos_embed",
    "resolve_block_indices",
]


POS_EMBED_INTERP = ("bicubic", "timm")
"""How the position-embedding grid is resampled to the input's token grid (module docstring)."""


def resample_pos_embed(vit: VisionTransformer, grid: Sequence[int], interp: str) -> torch.Tensor:
    """``vit.pos_embed`` (1, prefix + h0*w0, D) resampled to the token grid ``grid`` (h, w), prefix tokens kept."""
    return resample_abs_pos_embed(
        vit.pos_embed,
        new_size=list(grid),
        old_size=list(vit.patch_embed.grid_size),
        num_prefix_tokens=0 if vit.no_embed_class else vit.num_prefix_tokens,
        antialias=interp == "timm",
        align_corners=None if interp == "timm" else False,
    )


def _pos_embed_reference(vit: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """timm's ``VisionTransformer._pos_embed`` for ``dynamic_img_size`` models, with the reference's resampling:
    patch tokens ``x`` (B, h, w, D) -> (B, prefix + h*w, D) with the prefix tokens and the position embedding."""
    b, h, w, d = x.shape
    prefix = [t.expand(b, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    x = x.reshape(b, h * w, d)
    pos = _frozen_grid(vit, (h, w))
    if vit.no_embed_class:
        x = torch.cat([*prefix, x + pos], dim=1)
    else:
        x = torch.cat([*prefix, x], dim=1) + pos
    return vit.pos_drop(x)


FROZEN_GRIDS_KEPT = 8
"""Resampled grids kept per model (a training step uses one per CAM scale and the crop)."""


def _frozen_grid(vit: VisionTransformer, grid: tuple[int, int]) -> torch.Tensor:
    """:func:`resample_pos_embed` with the reference's bicubic, made once per grid while the position embedding is
    frozen (``model.freeze_pos_embed``) and unchanged, then reused: the CUDA bicubic kernel runs one thread per output
    position over all channels, 1.5 ms for DeiT-S's 384 channels on a 42 x 42 grid on an H100, three times per
    training step (the crop and the CAM scales). A trainable embedding is resampled at every call, and so is any
    embedding under ``torch.compile`` or an export, which would otherwise fix the grid the trace first saw (an ONNX
    model that takes one image size)."""
    pos = vit.pos_embed
    if pos.requires_grad or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return resample_pos_embed(vit, grid, "bicubic")
    cache = vit.__dict__.setdefault("_frozen_grids", OrderedDict())
    held = cache.pop(grid, None)
    if held is None or held[0] is not pos or held[1] != pos._version:  # another tensor, or written in place
        held = pos, pos._version, resample_pos_embed(vit, grid, "bicubic")
    cache[grid] = held  # the newest last; inference over many image sizes keeps the most recent few
    while len(cache) > FROZEN_GRIDS_KEPT:
        cache.popitem(last=False)
    return held[2]


@dataclass
class BackboneOutput:
    """Patch-token maps of one forward pass.

    Attributes:
        features: (B, D, h, w) final tokens after the final norm; None for an early-stopped pass.
        intermediates: (B, D, h, w) tokens of each requested block, without the final norm.
    """

    features: torch.Tensor | None
    intermediates: list[torch.Tensor]


class ViTBackbone(nn.Module):
    """A timm VisionTransformer (attribute ``vit``) returning patch-token maps.

    Intermediate block outputs come from timm's ``forward_intermediates``. The wrapper also owns the
    NeuTRENO first-layer values holder, which it clears after every forward.

    Args:
        vit: The timm model (``dynamic_img_size=True``), attention variants already swapped in.
        pos_embed_interp: One of :data:`POS_EMBED_INTERP`; ``bicubic`` replaces the model's ``_pos_embed`` with
            the reference's resampling, ``timm`` leaves timm's.
    """

    def __init__(self, vit: VisionTransformer, pos_embed_interp: str = "timm") -> None:
        super().__init__()
        if not hasattr(vit, "forward_intermediates") or not hasattr(vit, "blocks"):
            raise TypeError(f"expected a timm VisionTransformer, got {type(vit).__name__}")
        if pos_embed_interp not in POS_EMBED_INTERP:
            raise ValueError(f"pos_embed_interp {pos_embed_interp!r}: valid: {', '.join(POS_EMBED_INTERP)}")
        if pos_embed_interp == "bicubic" and vit.pos_embed is not None:
            vit._pos_embed = types.MethodType(_pos_embed_reference, vit)
        self.vit = vit
        self.pos_embed_interp = pos_embed_interp
        self.first_values: FirstValues | None = link_first_values(vit)

    @property
    def embed_dim(self) -> int:
        return self.vit.embed_dim

    @property
    def depth(self) -> int:
        return len(self.vit.blocks)

    @property
    def patch_size(self) -> int:
        """The patch size, i.e. the stride of the token maps (square patches only)."""
        ph, pw = self.vit.patch_embed.patch_size
        if ph != pw:
            raise ValueError(f"non-square patches {ph}x{pw} are not supported")
        return ph

    @property
    def data_config(self) -> dict[str, Any]:
        """timm's preprocessing config of the backbone (``mean``, ``std``, ``input_size``, ...)."""
        return timm.data.resolve_model_data_config(self.vit)

    def block_index(self, index: int) -> int:
        """``index`` (negative counts from the end) as a block index in ``[0, depth)``."""
        if not -self.depth <= index < self.depth:
            raise IndexError(f"block index {index} out of range for a backbone of {self.depth} blocks")
        return index % self.depth

    def forward(self, x: torch.Tensor, indices: Sequence[int] = (), stop_early: bool = False) -> BackboneOutput:
        """Token maps of images ``x`` (B, 3, H, W).

        Args:
            x: Normalised images.
            indices: Blocks (negative allowed) whose un-normed patch tokens to return.
            stop_early: Skip the blocks after the last requested one (``features`` is then None).
        """
        take = [self.block_index(i) for i in indices]
        if stop_early and not take:
            raise ValueError("stop_early needs at least one block index")
        try:
            if stop_early:
                inter = self.vit.forward_intermediates(x, take, stop_early=True, intermediates_only=True)
                return BackboneOutput(features=None, intermediates=list(inter))
            if take:
                final, inter = self.vit.forward_intermediates(x, take)
            else:
                final, inter = self.vit.forward_features(x), []
        finally:
            if self.first_values is not None:
                self.first_values.clear()
        return BackboneOutput(features=self.token_map(final, x.shape[-2:]), intermediates=list(inter))

    def token_map(self, tokens: torch.Tensor, image_size: Sequence[int]) -> torch.Tensor:
        """Patch tokens (B, prefix + h*w, D) of an image of ``image_size`` -> map (B, D, h, w)."""
        h, w = self.vit.patch_embed.dynamic_feat_size(tuple(image_size))
        patches = tokens[:, self.vit.num_prefix_tokens :]
        return patches.reshape(patches.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()


def build_backbone(
    name: str,
    pretrained: str = "",
    attention: str = "vanilla",
    attention_blocks: Sequence[int] | None = None,
    attention_kwargs: Mapping[str, Any] | None = None,
    drop_path_rate: float = 0.0,
    backbone_kwargs: Mapping[str, Any] | None = None,
    hub_timeout: float = 5.0,
    pos_embed_interp: str = "timm",
) -> ViTBackbone:
    """Create the timm ViT, load its weights, swap in the attention variant.

    Args:
        name: Any timm VisionTransformer name.
        pretrained: ``""`` random init; ``"hub"`` timm's default weights; ``"hub:<tag>"`` the weights
            ``<name>.<tag>``; otherwise a local checkpoint file (see :func:`load_timm_checkpoint`).
        attention: Variant name (:data:`wsss.models.attention.ATTENTION_VARIANTS`); ``vanilla`` is timm's.
        attention_blocks: Block indices (negative allowed) that get the variant; None: every block.
        attention_kwargs: The variant's own arguments (e.g. ``{"gamma": -1.0}`` for ``centered``).
        drop_path_rate: Stochastic depth rate.
        backbone_kwargs: Extra ``timm.create_model`` arguments (they override the defaults above).
        hub_timeout: Seconds to wait for the weights hub to answer before ``"hub"`` is taken as offline
            (:func:`create_vit`).
        pos_embed_interp: Position-embedding resampling (:data:`POS_EMBED_INTERP`); ``timm``, timm's own, keeps
            the backbone equal to timm's model at every size. The WSSS model takes ``model.pos_embed_interp``.
    """
    vit = create_vit(name, pretrained, drop_path_rate, backbone_kwargs, hub_timeout)
    apply_attention_variant(vit, attention, attention_blocks, **(attention_kwargs or {}))
    return ViTBackbone(vit, pos_embed_interp)


class PretrainedUnavailableError(RuntimeError):
    """``model.pretrained`` names hub weights that cannot be had: no network and no cached copy."""


OFFLINE_ROUTE = (
    "download the weights on a machine with internet (timm.create_model(NAME, pretrained=True) then "
    "torch.save(model.state_dict(), 'deit_s.pth')), copy the file here and set model.pretrained=deit_s.pth; "
    "README: 'On a machine without internet'"
)


def hub_reachable(timeout: float) -> bool:
    """Whether the Hugging Face hub that timm downloads from (``HF_ENDPOINT``) accepts a connection within
    ``timeout`` seconds; a machine without network answers at once or after ``timeout``."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def create_vit(
    name: str,
    pretrained: str = "",
    drop_path_rate: float = 0.0,
    backbone_kwargs: Mapping[str, Any] | None = None,
    hub_timeout: float = 5.0,
) -> VisionTransformer:
    """The plain timm model with its weights (see :func:`build_backbone` for the arguments).

    Hub weights: when the hub does not answer within ``hub_timeout`` seconds, timm is asked for its cached copy
    only (Hugging Face's offline mode), instead of retrying the download for about a minute.

    Raises:
        PretrainedUnavailableError: ``"hub"`` weights that are neither reachable nor cached (one line naming
            ``model.pretrained`` and the offline route).
    """
    require_vision_transformer(name)
    kwargs = {
        "dynamic_img_size": True,
        "dynamic_img_pad": True,
        "num_classes": 0,
        "drop_path_rate": drop_path_rate,
        **(backbone_kwargs or {}),
    }
    from_hub = pretrained == "hub" or pretrained.startswith("hub:")
    if from_hub:
        tag = pretrained[len("hub:") :] if pretrained.startswith("hub:") else ""
        hub_name = f"{name}.{tag}" if tag else name
        online = hub_reachable(hub_timeout)
        try:
            with mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", not online):
                vit = timm.create_model(hub_name, pretrained=True, **kwargs)
        except Exception as err:
            why = "no network and no cached copy" if not online else f"{type(err).__name__}: {err}"
            raise PretrainedUnavailableError(
                f"model.pretrained={pretrained!r}: timm's weights for '{hub_name}' cannot be loaded ({why}). "
                f"Offline: {OFFLINE_ROUTE.replace('NAME', repr(hub_name))}; or model.pretrained='' for random init"
            ) from None
    else:
        vit = timm.create_model(name, pretrained=False, **kwargs)
    if pretrained and not from_hub:
        load_timm_checkpoint(vit, pretrained)
    return vit


def require_vision_transformer(name: str) -> None:
    """Refuse a timm model that is not a ``VisionTransformer`` (swin, convnext, eva, relpos, naflex ViTs...)
    before timm builds it with arguments it may not take; the check builds it on the meta device (no memory).

    Raises:
        ValueError: ``name`` is another architecture; the message says which.
    """
    with torch.device("meta"):
        model = timm.models.model_entrypoint(name)(pretrained=False)
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"model.backbone '{name}' is a timm {type(model).__name__}; wsss needs a timm VisionTransformer "
            "(vit_*, deit_*, dinov2 / reg4 ViTs: timm.list_models('vit_*'))"
        )


def load_timm_checkpoint(vit: VisionTransformer, path: str | Path) -> None:
    """Load a timm state_dict file into ``vit`` with strict key matching.

    The file is read with ``torch.load(weights_only=True)``; it may be the state_dict itself or a dict with
    it under ``"model"`` or ``"state_dict"``. DDP/compile prefixes are removed, classifier-head keys the model
    lacks (``num_classes=0``) are dropped, and the position (and patch) embedding are resampled by timm's
    ``checkpoint_filter_fn`` if the checkpoint's grid differs from the model's.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is not a state_dict of this architecture, or is a whole wsss model (a checkpoint or a
            ``tools/export.py --safetensors`` export, which ``model.load_from`` takes); one line naming the file.
    """
    path = Path(path)
    fix = (
        "model.pretrained must be a timm state_dict of the configured backbone (model.backbone and "
        "model.backbone_kwargs must match it), 'hub' for timm's weights, or '' for random init"
    )
    if not path.is_file():
        raise FileNotFoundError(f"pretrained checkpoint not found: {path}. {fix}")
    whole_model = (
        f"{path} is a whole wsss model (backbone, heads and classes), not backbone weights: to start a run from it "
        f"set model.load_from={path} (model.pretrained is then not used)"
    )
    if _is_wsss_export(path):
        raise ValueError(whole_model)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"cannot read {path} with torch.load(weights_only=True): {err}. {fix}") from err
    if isinstance(obj, Mapping) and "model" in obj and "config" in obj:  # a checkpoint written by tools/train.py
        raise ValueError(whole_model)
    for key in ("model", "state_dict"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise ValueError(f"{path} does not hold a state_dict (a dict of name -> tensor). {fix}")
    own = vit.state_dict()
    state = {
        k: v
        for k, v in clean_state_dict(dict(obj)).items()
        if k in own or k.split(".", 1)[0] not in ("head", "head_dist")
    }
    try:
        state = checkpoint_filter_fn(state, vit)
        result = vit.load_state_dict(state, strict=False)
    except (RuntimeError, ValueError, KeyError) as err:
        raise ValueError(f"{path} does not fit backbone {type(vit).__name__}: {err}. {fix}") from err
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{path} does not fit the backbone: missing keys {_head(result.missing_keys)}, unexpected keys "
            f"{_head(result.unexpected_keys)}. {fix}"
        )


def _is_wsss_export(path: Path) -> bool:
    """Whether ``path`` is a safetensors file that ``tools/export.py --safetensors`` wrote (``wsss`` in its
    metadata), whatever its name."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("wsss") == "1"
    except (SafetensorError, OSError):
        return False


def _head(keys: Sequence[str], n: int = 8) -> str:
    more = f" ... ({len(keys)} in all)" if len(keys) > n else ""
    return f"[{', '.join(keys[:n])}{more}]"


def resolve_block_indices(blocks: Sequence[int] | None, depth: int) -> list[int]:
    """Sorted absolute block indices; None means all. Negative indices count from the end.

    Raises:
        IndexError: An index is out of range.
        ValueError: An index is repeated.
    """
    if blocks is None:
        return list(range(depth))
    out = []
    for i in blocks:
        if not -depth <= i < depth:
            raise IndexError(f"attention.blocks: index {i} out of range for {depth} blocks")
        out.append(i % depth)
    if len(set(out)) != len(out):
        raise ValueError(f"attention.blocks: {list(blocks)} names a block twice")
    return sorted(out)


def apply_attention_variant(
    vit: VisionTransformer, name: str, blocks: Sequence[int] | None = None, **kwargs: Any
) -> list[int]:
    """Swap the variant ``name`` into ``blocks`` (None: all) of ``vit`` in place, keeping the weights.

    Args:
        vit: The timm model.
        name: Variant name.
        blocks: Block indices, negative allowed.
        **kwargs: The variant's own arguments.

    Returns:
        The absolute indices of the converted blocks.
    """
    cls = get_variant(name)
    indices = resolve_block_indices(blocks, len(vit.blocks))
    for i in indices:
        vit.blocks[i] = cls.convert_block(vit.blocks[i], **kwargs)
    return indices
