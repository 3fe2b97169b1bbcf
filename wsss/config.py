"""Typed configuration: mmseg-style Python files validated into dataclasses.

A config file is plain Python (``_base_`` inheritance and ``--cfg-options a.b=v`` overrides as mmseg
users know them, parsed by ``mmengine.Config``). The resulting dict is validated into :class:`Config`:
unknown keys and wrong types are rejected with an error naming the key. Every number the pipeline uses
lives here; the defaults are the paper's (``docs/design.md`` section 3).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from wsss.data.classes import VOC_CLASSES
from wsss.utils.fileio import atomic_write_text

ENERGY_KERNELS = ("auto", "fused", "blocked")
"""Implementations of the energy loss's ``W S`` (:func:`wsss.losses.gaussian_filter`)."""


class ConfigError(ValueError):
    """A config value is unknown or of the wrong type."""


def choice(default: str, *others: str) -> Any:
    """A string field that accepts only ``default`` or one of ``others`` (checked by :func:`from_dict`)."""
    return field(default=default, metadata={"choices": (default, *others)})


def check_bounds(
    section: str,
    obj: Any,
    positive: tuple[str, ...] = (),
    non_negative: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
) -> None:
    """Raise ConfigError naming the key if a ``positive`` field of ``obj`` is not > 0, a ``non_negative`` one is
    not >= 0, or a ``unit`` one (a probability or a fraction) is not in [0, 1] (NaN fails all three)."""
    rules = (
        (positive, lambda v: v > 0, "> 0"),
        (non_negative, lambda v: v >= 0, ">= 0"),
        (unit, lambda v: 0 <= v <= 1, "in [0, 1]"),
    )
    for names, holds, text in rules:
        for name in names:
            value = getattr(obj, name)
            if not holds(value):
                raise ConfigError(f"config key '{section}.{name}': must be {text}, got {value!r}")


@dataclass
class DataConfig:
    """Dataset layout and training augmentation."""

    root: str = "data/VOCdevkit/VOC2012"
    layout: str = choice("voc", "tags")
    """``voc``: ids from split files, labels from ``tools/make_cls_labels.py``, masks for validation;
    ``tags``: ids and labels from a hand-written tags file (``label_file``, see :mod:`wsss.data.tags`), no masks."""
    image_dir: str = "JPEGImages"
    """Image folder under root; ids are paths relative to it (any nesting), with or without the extension."""
    classes: list[str] | str | None = field(default_factory=lambda: list(VOC_CLASSES))
    """Class names with background first, or a text file with one name per line; None: the tags file's."""
    train_split: str = "train_aug"
    """A split name (``ImageSets/Segmentation/<name>.txt`` under root) or a path to a split file."""
    val_split: str = "val"
    mask_dir: str = "SegmentationClassAug"
    label_file: str = "cls_labels.json"
    """Image-level labels written by ``tools/make_cls_labels.py``, or the tags file of the ``tags`` layout
    (relative to root, or absolute)."""
    val_fraction: float = 0.1
    """``tags`` layout: share of the tagged images held out as the ``val`` split (by a hash of the path)."""
    ignore_index: int = 255
    crop_size: int = 448
    scale_range: tuple[float, float] = (0.5, 2.0)
    hflip_prob: float = 0.5
    color_jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)
    """Brightness, contrast, saturation, hue."""
    color_jitter_prob: float = 0.8
    grayscale_prob: float = 0.2
    blur_prob: float = 1.0
    """Gaussian blur probability; the reference blurs every crop."""
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    pad_rgb: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """RGB (0-255) of the padding that fills a crop larger than the scaled image, applied before the colour
    augmentation and the normalisation (the reference pads black; the ImageNet mean grey is
    ``(123.675, 116.28, 103.53)``)."""
    num_workers: int = 2
    max_bad_images: int = 10
    """Training images that fail to decode are skipped with a warning naming the file (another image takes
    their place); more than this many per data-loading process stop the run."""
    check_images: bool = False
    """Before training, decode every image and mask of both splits and check the label file
    (``tools/check_dataset.py`` does the same alone); any problem stops the run before the first step."""
    min_class_images: int = 10
    """``tags`` layout: training starts with a warning (on screen and in ``log.txt``) naming every class tagged on
    fewer images of the tags file than this, as too few examples to learn it from; 0 turns the warning off."""
    follow_symlinks: bool = False
    """Read images and masks that are symlinks resolving outside ``root``. Ids are always confined: one that is
    absolute or climbs with ``..`` stops the run, naming its file and line (:mod:`wsss.data.paths`)."""
    max_image_pixels: int = 50_000_000
    """Training and validation images with more pixels (width x height, read from the header before decoding)
    are skipped with a warning, as unreadable ones are; 0: no cap. A decoded image takes 3 bytes per pixel
    and the random rescale of training up to ``scale_range[1]`` squared times that: 50 Mpx (a 8160 x 6120 phone
    photo) is 150 MB decoded; a 144 Mpx image (12000 x 12000, a 140 KB PNG) would be 1.7 GB at scale 2."""

    def __post_init__(self) -> None:
        check_bounds(
            "data",
            self,
            positive=("crop_size",),
            non_negative=("num_workers", "max_bad_images", "min_class_images", "max_image_pixels"),
            unit=("val_fraction", "hflip_prob", "color_jitter_prob", "grayscale_prob", "blur_prob"),
        )


@dataclass
class AttentionConfig:
    """Which self-attention variant replaces timm's, in which blocks, with its constants."""

    name: str = "centered"
    """One of ``vanilla``, ``centered``, ``neutreno``, ``gfsa``, ``contranorm``."""
    blocks: list[int] | None = None
    """Block indices (negative allowed) that get the variant; None means every block."""
    gamma: float = -1.0
    """centered: offset of the attention rows, which sum to 1 + gamma."""
    lam: float = 0.6
    """neutreno: weight of (V0 - V)."""
    k: int = 3
    """gfsa: order of the high-order term."""
    scale: float = 0.2
    """contranorm: strength s of the uniformity term."""
    tau: float = 1.0
    """contranorm: temperature."""
    normalize: bool = True
    """contranorm: L2-normalise tokens inside the similarity (the authors' code); False: the paper's raw form."""


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


@dataclass
class ModelConfig:
    """Backbone, attention variant and heads."""

    backbone: str = "deit_small_patch16_224"
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments to ``timm.create_model`` (e.g. depth for a small toy ViT); the keys and types of
    :data:`BACKBONE_KWARGS`."""
    pretrained: str = "hub"
    """``""`` (random init), ``hub`` (timm's default weights), ``hub:<tag>``, or a checkpoint file path."""
    load_from: str = ""
    """A wsss checkpoint (``.pth``) or export (``.safetensors``) whose weights a new run starts from (mmseg's
    ``load_from``, timm's ``--initial-checkpoint``); not its optimiser, schedule or iteration. With the same classes
    every weight is kept; with other classes the class heads (:data:`wsss.models.builder.CLASS_HEADS`) start afresh.
    The file holds every backbone weight, so ``pretrained`` is then not fetched; a resumed run ignores it (its own
    checkpoint holds every weight). ``""``: off."""
    hub_timeout: float = 5.0
    """Seconds to wait for the weights hub before ``hub`` is taken as offline (then only a cached copy loads)."""
    drop_path_rate: float = 0.0
    """Stochastic depth. The reference uses 0: the no-grad CAM pass runs in train mode, so drop-path would
    make the pseudo labels random."""
    freeze_pos_embed: bool = True
    """Keep the position embedding at its pretrained values (the reference freezes it)."""
    pos_embed_interp: str = choice("bicubic", "timm")
    """How the position-embedding grid is resampled to the input's token grid (at every forward: training crops,
    the CAM scales, validation, inference, export). ``bicubic``: the reference's plain ``F.interpolate(...,
    mode="bicubic", align_corners=False)``; ``timm``: timm's ``resample_abs_pos_embed`` (antialiased bicubic, a
    different kernel even when upsampling; docs/reference.md row 17)."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    aux_layer: int = -3
    """Block whose patch tokens (before the final norm) feed the auxiliary classifier."""
    decoder_channels: int = 512
    decoder_dilation: int = 5
    head_init: str = choice("default", "kaiming")
    """Init of the classifiers and the decoder (all bias-free): ``default`` is PyTorch's (the reference);
    ``kaiming`` is Kaiming-normal, which a backbone trained from scratch learns faster with."""

    def __post_init__(self) -> None:
        """Check ``backbone_kwargs`` and, when they give the depth, ``attention.blocks`` against it (every use of the
        backbone swaps the variant in). ``aux_layer`` is checked when the segmentation model is built
        (:func:`wsss.models.build_model`): a backbone pre-trained alone (``tools/pretrain.py``) has no aux head."""
        self.backbone_kwargs = check_backbone_kwargs(self.backbone_kwargs)
        depth = self.backbone_kwargs.get("depth")
        blocks = self.attention.blocks
        outside = [i for i in blocks or [] if depth is not None and not -depth <= i < depth]
        if outside:
            raise ConfigError(
                f"config keys 'model.attention.blocks' ({blocks!r}) and 'model.backbone_kwargs.depth' ({depth}): "
                f"block {outside[0]} does not exist in a backbone of {depth} blocks; keep the indices within "
                f"[{-depth}, {depth - 1}] or raise the depth"
            )


def check_backbone_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``model.backbone_kwargs`` checked against :data:`BACKBONE_KWARGS` (lists become tuples where the type says
    tuple); sizes must be > 0 and drop rates in [0, 1].

    Raises:
        ConfigError: An unknown key, a wrong type or a value out of range; the message names the key.
    """
    section = "model.backbone_kwargs"
    checked = {}
    for name, value in kwargs.items():
        key = _join(section, name)
        if name not in BACKBONE_KWARGS:
            close = difflib.get_close_matches(str(name), BACKBONE_KWARGS, n=1)
            hint = f" Did you mean '{_join(section, close[0])}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}'.{hint} Valid keys here: {', '.join(BACKBONE_KWARGS)}")
        spec = BACKBONE_KWARGS[name]
        if isinstance(spec, tuple):
            if value not in spec:
                raise ConfigError(f"config key '{key}': {value!r} is not one of {', '.join(map(repr, spec))}")
            checked[name] = value
        else:
            checked[name] = _coerce(spec, value, key)
    sizes = types.SimpleNamespace(**{k: v for k, v in checked.items() if k != "img_size"})
    present = set(vars(sizes))
    check_bounds(
        section,
        sizes,
        positive=tuple(present & {"patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio"}),
        non_negative=tuple(present & {"reg_tokens"}),
        unit=tuple(k for k in present if k.endswith("drop_rate")),
    )
    img_size = checked.get("img_size", 1)
    if min(img_size if isinstance(img_size, tuple) else (img_size,)) <= 0:
        raise ConfigError(f"config key '{section}.img_size': must be > 0, got {img_size!r}")
    return checked


@dataclass
class CamConfig:
    """Class activation maps and their thresholds."""

    scales: tuple[float, ...] = (1.0, 0.5, 1.5)
    fg_thresh: float = 0.7
    bg_thresh: float = 0.25
    infer_bg_thresh: float = 0.5


@dataclass
class ParConfig:
    """Pixel-adaptive refinement of CAMs."""

    num_iter: int = 10
    dilations: tuple[int, ...] = (1, 2, 4, 8, 12, 24)
    w1: float = 0.3
    w2: float = 0.01
    scale: float = 0.5


@dataclass
class LossConfig:
    """Loss weights, the iteration at which the dense losses start, energy-loss constants."""

    aux_weight: float = 1.0
    seg_weight: float = 0.1
    reg_weight: float = 0.05
    seg_start_iter: int = 2001
    """First (0-based) iteration with ``seg_weight`` and ``reg_weight`` on; the reference keeps them at 0
    while ``n_iter <= 2000``."""
    reg_energy_weight: float = 1e-7
    """Multiplier of the dense energy inside the loss (ToCo's); ``reg_weight`` then weights the loss."""
    reg_lattice_match: float = 0.59
    """Factor on ``reg_energy_weight`` that gives the exact dense kernel the strength of the reference's
    permutohedral lattice (measured on photographs, see :mod:`wsss.losses` and docs/reference.md); 1.0 applies
    ToCo's weight to the exact energy, which then regularises 1 / 0.59 = 1.7x more strongly."""
    reg_sigma_rgb: float = 15.0
    reg_sigma_xy: float = 100.0
    reg_scale: float = 0.5
    reg_kernel: str = choice(*ENERGY_KERNELS)
    """How ``W S`` of the energy is evaluated, exactly either way: ``fused`` (one Triton kernel, no tile of ``W``
    in memory; CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``blocked`` (tiles in PyTorch, any device) or
    ``auto`` (fused on CUDA when triton is installed, blocked elsewhere)."""


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then polynomial decay."""

    lr: float = 6e-5
    head_lr_mult: float = 10.0
    weight_decay: float = 0.01
    no_decay_1d: bool = False
    """Exempt 1-D parameters (norms, biases), ``pos_embed`` and ``cls_token`` from weight decay (timm's
    habit); the reference decays every trained parameter."""
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_iters: int = 2500
    warmup_ratio: float = 1e-6
    power: float = 0.9

    def __post_init__(self) -> None:
        check_bounds("optim", self, positive=("lr", "head_lr_mult"), non_negative=("weight_decay", "warmup_iters"))


@dataclass
class TrainConfig:
    """Loop length, batch, intervals."""

    max_iters: int = 80000
    batch_size: int = 4
    """Images per process. Under ``torchrun`` every process draws its own batch and computes PAR, the pseudo labels
    and the balanced CE on it (gradients averaged), so the global batch is ``batch_size`` x the number of processes.
    The paper's batch 4 is 4 on one GPU, 2 on two (ToCo's run: 2 GPUs x 2 images), 1 on four; the splits differ
    only in how the balanced CE pools pixels (docs/reference.md row 13)."""
    seed: int = 0
    amp: bool = True
    """bf16 autocast on GPU (ignored on CPU)."""
    cam_dtype: str = choice("float32", "bfloat16")
    """Precision of the no-grad CAM pass that feeds the pseudo labels: ``float32`` (the reference) or
    ``bfloat16`` (autocast, with ``amp`` on a GPU)."""
    compile: bool = False
    """``torch.compile`` the model's forward pass of the training step (the CAM pass and validation run eagerly)."""
    val_input: str = choice("crop", "original")
    """Validation input size: ``crop`` resizes each image to ``data.crop_size`` squared and the predictions
    back to the mask (the reference's logged numbers); ``original`` runs at the image's own size."""
    log_interval: int = 50
    val_interval: int = 5000
    ckpt_interval: int = 5000
    max_keep_ckpts: int = 3
    """Newest ``iter_*.pth`` kept in the work dir, besides the best-validated and the last one; -1 keeps all."""
    val_max_images: int | None = None
    chance_loss_ratio: float = 0.9
    """Warn when the classification loss after the warm-up is still above this fraction of ln 2 (chance)."""

    def __post_init__(self) -> None:
        intervals = ("max_iters", "batch_size", "log_interval", "val_interval", "ckpt_interval")
        check_bounds("train", self, positive=intervals)


@dataclass
class CrfConfig:
    """Dense CRF post-processing (Krähenbühl & Koltun 2011; docs/design.md section 3)."""

    backend: str = choice("torch", "pydensecrf")
    """``torch``: the mean-field over a permutohedral lattice in PyTorch (:mod:`wsss.inference.permutohedral`), on the
    device of the probabilities, many images per call; ``pydensecrf``: the reference C++ (pydensecrf2, which must be
    installed and needs a compiler to install), in ``workers`` processes. docs/reference.md row 19."""
    gaussian_sxy: float = 1.0
    gaussian_compat: float = 1.0
    bilateral_sxy: float = 121.0
    bilateral_srgb: float = 5.0
    bilateral_compat: float = 4.0
    iterations: int = 10
    reference_padding: bool = True
    """``torch`` backend: add the lattice points pydensecrf's SSE build adds when an image's pixel count is not a
    multiple of 4 (padding points at feature 0, whose simplex joins the lattice and relays the blur), so the
    marginals equal the reference's; False, the filter without them. docs/reference.md row 19 measures both."""
    workers: int = 2
    """Processes of the ``pydensecrf`` backend (0: serial in the calling process); the ``torch`` backend runs in the
    calling process on the probabilities' device and ignores it."""


@dataclass
class InferConfig:
    """Test-time augmentation."""

    scales: tuple[float, ...] = (1.0, 1.25, 1.5)
    flip: bool = True
    cls_thresh: float = 0.5
    """A class counts as present (its CAM is drawn) when its classifier sigmoid exceeds this; when none does, the
    most probable class counts as present (the top-1 rule)."""
    mask_classes: str = choice("present", "all")
    """Which classes the mask may hold: ``present``, background and the classes present by ``cls_thresh`` and the
    top-1 rule (the argmax, and the CRF, run over those alone), so the mask, the CAMs shown and the image's
    ``present`` classes agree; ``all``, every class (the reference: ToCo's inference takes the argmax over all).
    Measured in docs/reference.md row 18: restricting raises the toy val mIoU."""
    logits_stride: int = 4
    """Saved logits (``--logits``) are downscaled by this factor (> 0)."""
    max_size: int | None = 1024
    """Longest image side the model sees; larger images are downscaled for the model and their masks brought back
    to the original size. 0: no cap, every image at its own size. None, as checkpoints written before this default
    hold it: 1024. The default bounds the model's work and memory per image, which grow with the square of its
    tokens: a 12000 x 12000 PNG (140 KB, under PIL's bomb limit) at its own size ran over 10 minutes at 6.3 GB and
    SIGTERM could not stop the op that ran; capped, it took 19 s on 2 CPU cores and SIGTERM ended it in 2 s. At
    1024 the largest default TTA scale 1.5 gives a DeiT-S/16 at most 96 x 96 tokens (an op takes seconds on a CPU),
    while VOC (500 px), COCO (640 px) and the 448 px training crops keep their own size. The outputs come back to
    full size in bands of ``max_size**2`` pixels, so no full-size float map is held (docs/benchmarks.md: that PNG
    peaks at 1.79 GiB RSS, 6.20 GiB before)."""
    crf: CrfConfig = field(default_factory=CrfConfig)

    def __post_init__(self) -> None:
        if self.max_size is None:
            self.max_size = type(self).max_size
        check_bounds("infer", self, positive=("logits_stride",), non_negative=("max_size",))


@dataclass
class PretrainConfig:
    """Classification pre-training of the backbone (``tools/pretrain.py``); WSSS training never reads it."""

    labels: str = choice("image", "crop")
    """A crop's targets: ``image``, the image's labels (``data.label_file``), as WSSS training uses them; or
    ``crop``, the classes that cover at least ``crop_label_min_fraction`` of the crop in its mask, for a
    pre-training set whose masks are generated with it (the toy sets), as ImageNet's labels name what an
    object-centred image shows."""
    crop_label_min_fraction: float = 0.02
    """Share of the crop's pixels a class must cover to be a ``crop`` label."""

    def __post_init__(self) -> None:
        check_bounds("pretrain", self, non_negative=("crop_label_min_fraction",))


@dataclass
class GpuCheckConfig:
    """``make gpu-check`` (:mod:`wsss.gpu_check`): sizes and limits of the comparisons on a real GPU."""

    tolerance: float = 1e-3
    """Largest relative difference (norm of the difference over the norm) of a CUDA result from its reference."""
    crop_size: int = 224
    """Input edge of the model comparisons (the step's terms on CUDA and CPU, timm's ViT)."""
    energy_points: tuple[int, ...] = (300, 100)
    """Sizes of the energy-filter comparisons with brute force (those of tests/test_energy_kernel.py)."""
    energy_channels: tuple[int, ...] = (21, 4)
    energy_offsets: tuple[float, ...] = (3.0, 500.0)
    """A common offset of the features (the kernel centres them)."""
    energy_side: int = 224
    """Fused against blocked on a ``energy_side`` squared grid: the paper's 448 crop at ``loss.reg_scale`` 0.5."""
    image_size: tuple[int, int] = (375, 500)
    """(H, W) of the images the Segmenter and the evaluator compare on (a typical VOC photo)."""
    min_mask_agreement: float = 0.999
    """Smallest fraction of mask pixels equal on CUDA and the CPU."""
    part_timeout: float = 300.0
    """Seconds each subprocess (benchmark, toy set, torchrun) may take."""
    toy_images: int = 16
    ddp_iters: int = 30
    ddp_resume_from: int = 20


@dataclass
class Config:
    """The whole pipeline's configuration."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cam: CamConfig = field(default_factory=CamConfig)
    par: ParConfig = field(default_factory=ParConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    infer: InferConfig = field(default_factory=InferConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    gpu_check: GpuCheckConfig = field(default_factory=GpuCheckConfig)
    work_dir: str = ""


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Validate a nested dict into dataclass ``cls``.

    Args:
        cls: The dataclass to build.
        data: A mapping of field names to values (nested mappings for nested dataclasses).
        key: Dotted prefix of ``data`` within the whole config, used in error messages.

    Raises:
        ConfigError: On an unknown key or a value of the wrong type; the message names the key.
    """
    where = key or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a dict, got {type(data).__name__} {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for name in data:
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" Did you mean '{_join(key, close[0])}'?" if close else ""
            raise ConfigError(f"unknown config key '{_join(key, name)}'.{hint} Valid keys here: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(cls) if "choices" in f.metadata}
    values = {name: _coerce(hints[name], value, _join(key, name)) for name, value in data.items()}
    for name, value in values.items():
        if name in choices and value not in choices[name]:
            raise ConfigError(
                f"config key '{_join(key, name)}': {value!r} is not one of {', '.join(map(repr, choices[name]))}"
            )
    return cls(**values)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against type ``tp`` and convert lists to tuples where the type says tuple."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}': {value!r} matches none of {_type_name(tp)}")
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"config key '{key}': expected None, got {value!r}")
        return None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        return float(value)
    if tp in (int, bool, str):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"config key '{key}': expected {tp.__name__}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        else:
            if len(value) != len(args):
                raise ConfigError(f"config key '{key}': expected {len(args)} values, got {value!r}")
            items = [_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"config key '{key}': expected a dict with string keys, got {value!r}")
        return {k: _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"unsupported config field type {tp!r} for '{key}'")


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "")


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts, lists and tuples (safe for ``torch.load(weights_only=True)``)."""
    return dataclasses.asdict(cfg)


def load_config(path: str | Path, options: dict[str, Any] | None = None) -> Config:
    """Load a Python config file (with ``_base_`` inheritance) and apply dotted-key overrides.

    Args:
        path: The config file.
        options: ``{"a.b": value}`` overrides, as parsed from ``--cfg-options a.b=value``.

    Raises:
        FileNotFoundError: The file, or a ``_base_`` file, does not exist.
        ConfigError: An unknown key or a wrong type (in the file or in the overrides), or a config file that is not
            one: a folder, not ``.py``, a Python syntax error, a ``_base_`` cycle (:func:`check_config_files`).
    """
    from mmengine.config import Config as MMConfig

    path = Path(path)
    if path.is_dir():
        found = ", ".join(sorted(p.name for p in path.glob("*.py"))[:3])
        raise ConfigError(f"{path} is a directory, not a config file; give a .py file in it ({found or 'none there'})")
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    check_config_files(path)
    raw = MMConfig.fromfile(str(path))
    if options:
        raw.merge_from_dict(options)
    data = raw.to_dict()
    data.pop("_base_", None)
    return from_dict(Config, data)


def check_config_files(path: Path, chain: tuple[Path, ...] = ()) -> None:
    """Check a config file and its ``_base_`` files, each in one line naming the file, where mmengine would give a
    traceback or a misleading message: a Python syntax error (with its line), a ``_base_`` cycle, a ``_base_``
    that is missing, a folder or not a ``.py`` config. ``pkg::path`` bases are left to mmengine.

    Args:
        path: An existing config file.
        chain: The files that led to ``path`` through their ``_base_`` (resolved), for the cycle check.

    Raises:
        FileNotFoundError: A ``_base_`` file does not exist.
        ConfigError: Any other of the above.
    """
    if path.suffix != ".py":
        raise ConfigError(f"{path}: a config file is Python (.py); give the .py config")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason}, byte {err.start}); save it as UTF-8") from None
    except SyntaxError as err:
        raise ConfigError(f"{path} line {err.lineno}: Python syntax error ({err.msg}); fix the config there") from None
    chain = (*chain, path.resolve())
    for base in _base_names(tree, path):
        if "::" in base:
            continue
        target = path.parent / base
        if target.resolve() in chain:
            cycle = chain[chain.index(target.resolve()) :] + (target.resolve(),)
            raise ConfigError(f"_base_ cycle: {' -> '.join(map(str, cycle))}; remove the _base_ of one of them")
        if target.is_dir():
            raise ConfigError(f"{path}: _base_ '{base}' is a directory; name a .py config file in it")
        if not target.is_file():
            raise FileNotFoundError(
                f"{path}: _base_ '{base}' not found ({target}); _base_ paths are relative to the file that names them"
            )
        if target.suffix != ".py":
            raise ConfigError(f"{path}: _base_ '{base}' is not a Python config file (.py); point it at a .py config")
        check_config_files(target, chain)


def _base_names(tree: ast.Module, path: Path) -> list[str]:
    """The file names of the first top-level ``_base_ = ...`` of a parsed config (mmengine reads that one)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_base_":
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                value = None
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
                raise ConfigError(
                    f"{path}: _base_ must be a file name or a list of file names (line {node.lineno}), "
                    f"got {ast.unparse(node.value)}"
                )
            return list(names)
    return []


def apply_options(cfg: Config, options: dict[str, Any], prefix: str = "") -> Config:
    """``cfg`` with ``{"a.b": value}`` overrides merged as ``--cfg-options`` merges them, validated again.

    Args:
        cfg: The config to override (not modified).
        options: Dotted keys -> values, as :func:`parse_cfg_options` returns them.
        prefix: If given, only keys under it are allowed (``"infer."`` for inference settings).

    Raises:
        ConfigError: A key outside ``prefix``, an unknown key or a wrong type.
    """
    from mmengine.config import Config as MMConfig

    outside = [k for k in options if not k.startswith(prefix)]
    if outside:
        raise ConfigError(f"--cfg-options: only {prefix}* keys can be set here, got '{outside[0]}'")
    raw = MMConfig(to_dict(cfg))
    raw.merge_from_dict(options)
    return from_dict(Config, raw.to_dict())


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as a self-contained Python config file that :func:`load_config` reads back identically."""
    lines = ["# Resolved wsss config: every value explicit, no _base_.\n"]
    for name, value in to_dict(cfg).items():
        lines.append(f"{name} = {_literal(value)}\n")
    atomic_write_text(path, "".join(lines))


def _literal(value: Any, indent: int = 0) -> str:
    """Python source for a nested value, one dict item per line; non-finite floats as ``float('nan')``."""
    pad = "    " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"{pad}{k!r}: {_literal(v, indent + 1)},\n" for k, v in value.items())
        return "{\n" + items + "    " * indent + "}"
    if isinstance(value, (list, tuple)):
        body = ", ".join(_literal(v, indent + 1) for v in value)
        if isinstance(value, list):
            return f"[{body}]"
        return f"({body},)" if len(value) == 1 else f"({body})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


def parse_cfg_options(items: list[str] | None) -> dict[str, Any]:
    """Parse ``["a.b=1", "c=[1,2]"]`` as mmengine's ``DictAction`` does (numbers, booleans, None, lists as
    ``[a, b]`` or ``a,b``, tuples as ``(a, b)``, surrounding quotes dropped), but keep the spaces of a value as
    typed: ``data.root=/data/my set`` stays ``/data/my set`` (``DictAction`` removes every space). List and tuple
    items lose only the spaces around them.

    Raises:
        ConfigError: An item without ``=``, or a value with unbalanced brackets.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--cfg-options expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        out[key] = _parse_value(value.strip("'\""), item)
    return out


def _parse_value(text: str, item: str) -> Any:
    """A list for ``[...]`` or ``a,b``, a tuple for ``(...)``, else a number, bool, None or ``text`` itself."""
    bare = text.strip()
    if bare[:1] + bare[-1:] in ("[]", "()"):
        values = _parse_items(bare[1:-1], item)
        return tuple(values) if bare[0] == "(" else values
    if "," in bare:
        return _parse_items(bare, item)
    for number in (int, float):
        try:
            return number(bare)
        except ValueError:
            pass
    if bare.lower() in ("true", "false"):
        return bare.lower() == "true"
    return None if bare == "None" else text


def _parse_items(body: str, item: str) -> list[Any]:
    """The comma-separated values of ``body``, split outside brackets; a trailing comma adds nothing."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += (char in "([") - (char in ")]")
        if depth < 0:
            break
        if char == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"--cfg-options: unbalanced brackets in '{item}'")
    parts.append(body[start:])
    if not parts[-1].strip():
        parts.pop()
    return [_parse_value(part.strip().strip("'\""), item) for part in parts]
