"""Model: timm ViT backbone with attention variants, CAM classifiers, LargeFOV decoder."""

from wsss.models.attention import (
    ATTENTION_VARIANTS,
    CenteredAttention,
    ContraNorm,
    ContraNormBlock,
    FirstValues,
    GFSAAttention,
    NeuTRENOAttention,
    VanillaAttention,
    VariantAttention,
    build_attention,
    get_variant,
    link_first_values,
    record_attention,
    set_fused_attention,
)
from wsss.models.backbone import (
    BackboneOutput,
    ViTBackbone,
    apply_attention_variant,
    build_backbone,
    create_vit,
    load_timm_checkpoint,
    resolve_block_indices,
)
from wsss.models.heads import Classifier, LargeFOV
from wsss.models.segmentor import ModelOutput, WSSSModel, build_model, resize_to_image

__all__ = [
    "ATTENTION_VARIANTS",
    "BackboneOutput",
    "CenteredAttention",
    "Classifier",
    "ContraNorm",
    "ContraNormBlock",
    "FirstValues",
    "GFSAAttention",
    "LargeFOV",
    "ModelOutput",
    "NeuTRENOAttention",
    "VanillaAttention",
    "VariantAttention",
    "ViTBackbone",
    "WSSSModel",
    "apply_attention_variant",
    "build_attention",
    "build_backbone",
    "build_model",
    "create_vit",
    "get_variant",
    "link_first_values",
    "load_timm_checkpoint",
    "record_attention",
    "resize_to_image",
    "resolve_block_indices",
    "set_fused_attention",
]
