"""Model: timm ViT backbone with attention variants, CAM classifiers, LargeFOV decoder, test-time augmentation."""

from wsss.models.attention import (
    CenteredAttention,
    FirstValues,
    GFSAAttention,
    NeuTRENOAttention,
    VanillaAttention,
    VariantAttention,
    link_first_values,
    record_attention,
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
from wsss.models.builder import attention_args, build_model, build_model_backbone
from wsss.models.contranorm import ContraNorm, ContraNormBlock
from wsss.models.heads import Classifier, LargeFOV
from wsss.models.segmentor import (
    ModelOutput,
    PixelResize,
    WSSSModel,
    bilinear_matrix,
    cover_image,
    maps_to_pixels,
    resize_to_image,
)
from wsss.models.tta import TTAOutput, predict_logits, predicted_classes, tta_forward
from wsss.models.variants import ATTENTION_VARIANTS, build_attention, get_variant, set_fused_attention

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
    "PixelResize",
    "TTAOutput",
    "VanillaAttention",
    "VariantAttention",
    "ViTBackbone",
    "WSSSModel",
    "apply_attention_variant",
    "attention_args",
    "bilinear_matrix",
    "build_attention",
    "build_backbone",
    "build_model",
    "build_model_backbone",
    "cover_image",
    "create_vit",
    "get_variant",
    "link_first_values",
    "load_timm_checkpoint",
    "maps_to_pixels",
    "predict_logits",
    "predicted_classes",
    "record_attention",
    "resize_to_image",
    "resolve_block_indices",
    "set_fused_attention",
    "tta_forward",
]
