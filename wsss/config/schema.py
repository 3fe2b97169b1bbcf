"""The config schema: one dataclass per section of :class:`Config`, every field with its default (the paper's,
``docs/design.md`` section 3) and, for a number, its range (:func:`~wsss.config.validation.bounded`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wsss.config.backbone_kwargs import check_backbone_kwargs
from wsss.config.validation import (
    FINITE,
    ITERATIONS,
    MAX_ITEMS,
    MAX_SIDE,
    NON_NEGATIVE,
    POSITIVE,
    SCALE,
    SIDE,
    UINT8_MAX,
    UNIT,
    WORKERS,
    ConfigError,
    Range,
    Section,
    bounded,
    check_ignore_index,
    check_order,
    check_range,
    choice,
)
from wsss.data.classes import VOC_CLASSES

ENERGY_KERNELS = ("lattice", "auto", "fused", "blocked")
"""Implementations of the energy loss's ``W S``, the default first: the reference's lattice
(:func:`wsss.losses.lattice_filter`) and the exact ones (:func:`wsss.losses.gaussian_filter`)."""
FP32_PRECISIONS = ("tf32", "ieee")
"""How a GPU computes float32 matrix products and convolutions (:func:`wsss.utils.tensors.fp32_precision`),
named as torch's ``fp32_precision`` names them."""

PAR_KERNELS = ("auto", "fused", "torch")
"""Implementations of PAR (:class:`wsss.par.PAR`)."""

CRF_KERNELS = ("auto", "fused", "torch")
"""Implementations of the torch CRF's sparse products (:mod:`wsss.inference.crf`)."""
CRF_BLUR_DIRECTIONS = 3
"""The most lattice directions one launch of the CRF's blur kernel takes (``infer.crf.blur_directions``): each one more
triples the rows it gathers per lattice point (3, 9, 27)."""

FRACTION = Range(0, 1, low_open=True)
"""A share that cannot be 0 (a resize factor, a tolerance)."""

BLUR_SIGMA = Range(0, 50, low_open=True, why="ceiling 50: the blur kernel is about 6 sigma wide")


@dataclass
class DataConfig(Section):
    """Dataset layout and training augmentation."""

    KEY = "data"

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
    val_fraction: float = bounded(0.1, UNIT)
    """``tags`` layout: share of the tagged images held out as the ``val`` split (by a hash of the path)."""
    ignore_index: int = bounded(255, Range(0, UINT8_MAX))
    """Mask value of the pixels no loss or metric counts: a uint8 value above every class index."""
    crop_size: int = bounded(448, SIDE)
    scale_range: tuple[float, float] = bounded((0.5, 2.0), SCALE)
    """Smallest and largest random rescale of a training image."""
    hflip_prob: float = bounded(0.5, UNIT)
    color_jitter: tuple[float, float, float, float] = bounded((0.4, 0.4, 0.2, 0.1), UNIT)
    """Brightness, contrast, saturation, hue (at most 0.5, half the hue circle)."""
    color_jitter_prob: float = bounded(0.8, UNIT)
    grayscale_prob: float = bounded(0.2, UNIT)
    blur_prob: float = bounded(1.0, UNIT)
    """Gaussian blur probability; the reference blurs every crop."""
    blur_sigma: tuple[float, float] = bounded((0.1, 2.0), BLUR_SIGMA)
    pad_rgb: tuple[float, float, float] = bounded((0.0, 0.0, 0.0), Range(0, 255))
    """RGB (0-255) of the padding that fills a crop larger than the scaled image, applied before the colour
    augmentation and the normalisation (the reference pads black; the ImageNet mean grey is
    ``(123.675, 116.28, 103.53)``)."""
    num_workers: int = bounded(2, WORKERS)
    max_bad_images: int = bounded(10, NON_NEGATIVE)
    """Training images that fail to decode are skipped with a warning naming the file (another image takes
    their place); more than this many per data-loading process stop the run."""
    check_images: bool = False
    """Before training, decode every image and mask of both splits and check the label file
    (``tools/check_dataset.py`` does the same alone); any problem stops the run before the first step."""
    min_class_images: int = bounded(10, NON_NEGATIVE)
    """``tags`` layout: training starts with a warning (on screen and in ``log.txt``) naming every class tagged on
    fewer images of the tags file than this, as too few examples to learn it from; 0 turns the warning off."""
    follow_symlinks: bool = False
    """Read images and masks that are symlinks resolving outside ``root``. Ids are always confined: one that is
    absolute or climbs with ``..`` stops the run, naming its file and line (:mod:`wsss.data.paths`)."""
    max_image_pixels: int = bounded(50_000_000, NON_NEGATIVE)
    """Training and validation images with more pixels (width x height, read from the header before decoding)
    are skipped with a warning, as unreadable ones are; 0: no cap. A decoded image takes 3 bytes per pixel
    and the random rescale of training up to ``scale_range[1]`` squared times that: 50 Mpx (a 8160 x 6120 phone
    photo) is 150 MB decoded; a 144 Mpx image (12000 x 12000, a 140 KB PNG) would be 1.7 GB at scale 2."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_order("data.scale_range", *self.scale_range)
        check_order("data.blur_sigma", *self.blur_sigma)
        check_range("data.color_jitter[3]", self.color_jitter[3], Range(0, 0.5, why="hue: half the hue circle"))
        if isinstance(self.classes, list):
            check_ignore_index(self.ignore_index, len(self.classes))


@dataclass
class AttentionConfig(Section):
    """Which self-attention variant replaces timm's, in which blocks, with its constants."""

    KEY = "model.attention"

    name: str = "centered"
    """One of ``vanilla``, ``centered``, ``neutreno``, ``gfsa``, ``contranorm``."""
    blocks: list[int] | None = None
    """Block indices (negative allowed) that get the variant; None means every block."""
    gamma: float = bounded(-1.0, FINITE)
    """centered: offset of the attention rows, which sum to 1 + gamma."""
    lam: float = bounded(0.6, FINITE)
    """neutreno: weight of (V0 - V)."""
    k: int = bounded(3, Range(1, 16, why="ceiling 16 matrix products per block"))
    """gfsa: order of the high-order term."""
    scale: float = bounded(0.2, FINITE)
    """contranorm: strength s of the uniformity term."""
    tau: float = bounded(1.0, POSITIVE)
    """contranorm: temperature."""
    normalize: bool = True
    """contranorm: L2-normalise tokens inside the similarity (the authors' code); False: the paper's raw form."""


@dataclass
class ModelConfig(Section):
    """Backbone, attention variant and heads."""

    KEY = "model"

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
    hub_timeout: float = bounded(5.0, Range(0, 600, low_open=True, why="ceiling 600 s"))
    """Seconds to wait for the weights hub before ``hub`` is taken as offline (then only a cached copy loads)."""
    drop_path_rate: float = bounded(0.0, Range(0, 1, high_open=True))
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
    decoder_channels: int = bounded(512, Range(1, 8192, why="ceiling 8192, 16x the paper's 512"))
    decoder_dilation: int = bounded(5, Range(1, 64, why="ceiling 64"))
    head_init: str = choice("default", "kaiming")
    """Init of the classifiers and the decoder (all bias-free): ``default`` is PyTorch's (the reference);
    ``kaiming`` is Kaiming-normal, which a backbone trained from scratch learns faster with."""

    def __post_init__(self) -> None:
        """Check ``backbone_kwargs`` and, when they give the depth, ``attention.blocks`` against it (every use of the
        backbone swaps the variant in). ``aux_layer`` is checked when the segmentation model is built
        (:func:`wsss.models.build_model`): a backbone pre-trained alone (``tools/pretrain.py``) has no aux head."""
        super().__post_init__()
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


@dataclass
class CamConfig(Section):
    """Class activation maps and their thresholds."""

    KEY = "cam"

    scales: tuple[float, ...] = bounded((1.0, 0.5, 1.5), SCALE, MAX_ITEMS)
    fg_thresh: float = bounded(0.7, UNIT)
    """Background plane of the foreground stack of the pseudo labels (:mod:`wsss.pseudo_label`): a class must
    beat it to be foreground; >= ``bg_thresh``, the pixels between the two are ignored."""
    bg_thresh: float = bounded(0.25, UNIT)
    infer_bg_thresh: float = bounded(0.5, UNIT)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.bg_thresh <= self.fg_thresh:
            raise ConfigError(
                f"config keys 'cam.bg_thresh' ({self.bg_thresh!r}) and 'cam.fg_thresh' ({self.fg_thresh!r}): bg_thresh "
                "must be <= fg_thresh (the pixels between the two are the ignored band of the pseudo labels)"
            )


@dataclass
class ParConfig(Section):
    """Pixel-adaptive refinement of CAMs."""

    KEY = "par"

    num_iter: int = bounded(10, ITERATIONS)
    dilations: tuple[int, ...] = bounded((1, 2, 4, 8, 12, 24), Range(1, 256, why="ceiling 256 px"), MAX_ITEMS)
    w1: float = bounded(0.3, POSITIVE)
    w2: float = bounded(0.01, NON_NEGATIVE)
    scale: float = bounded(0.5, FRACTION)
    kernel: str = choice(*PAR_KERNELS)
    """How PAR is evaluated, the same formulas either way (float32 rounding apart): ``fused`` (Triton kernels, one
    launch for the affinities and one per step; CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``torch`` (PyTorch
    operations, one per neighbour and step, any device) or ``auto`` (fused on CUDA when triton is installed, torch
    elsewhere)."""


@dataclass
class LossConfig(Section):
    """Loss weights, the iteration at which the dense losses start, energy-loss constants."""

    KEY = "loss"

    aux_weight: float = bounded(1.0, NON_NEGATIVE)
    seg_weight: float = bounded(0.1, NON_NEGATIVE)
    reg_weight: float = bounded(0.05, NON_NEGATIVE)
    seg_start_iter: int = bounded(2001, NON_NEGATIVE)
    """First (0-based) iteration with ``seg_weight`` and ``reg_weight`` on; the reference keeps them at 0
    while ``n_iter <= 2000``."""
    reg_energy_weight: float = bounded(1e-7, NON_NEGATIVE)
    """Multiplier of the dense energy inside the loss (ToCo's); ``reg_weight`` then weights the loss."""
    reg_lattice_match: float = bounded(0.59, POSITIVE)
    """Factor on ``reg_energy_weight`` that gives the exact dense kernel the strength of the reference's
    permutohedral lattice (measured on photographs, see :mod:`wsss.losses` and docs/reference.md); 1.0 applies
    ToCo's weight to the exact energy, which then regularises 1 / 0.59 = 1.7x more strongly. Not applied with
    ``reg_kernel="lattice"``, which is the reference's lattice."""
    reg_sigma_rgb: float = bounded(15.0, POSITIVE)
    reg_sigma_xy: float = bounded(100.0, POSITIVE)
    reg_scale: float = bounded(0.5, FRACTION)
    reg_kernel: str = choice(*ENERGY_KERNELS)
    """How ``W S`` of the energy is evaluated: by ``lattice``, the default, the reference's permutohedral lattice
    (ToCo's ``bilateralfilter`` of meng-tang/rloss, equal to it within float32 rounding) at ToCo's weight (no
    ``reg_lattice_match``), about ``N (d+1)`` points' work instead of ``N^2`` pairs'; or exactly (docs/reference.md
    row 6) by ``fused`` (one Triton kernel, no tile of ``W`` in memory; CUDA, or the CPU under
    ``TRITON_INTERPRET=1``), ``blocked`` (tiles in PyTorch, any device) or ``auto`` (fused on CUDA when triton is
    installed, blocked elsewhere)."""
    seg_resize: str = choice("matmul", "interpolate")
    """How the decoder's logits are brought to the crop's pixels for the seg and energy losses, the same bilinear
    resize either way (float32 rounding apart): ``matmul`` (one product per axis, :class:`wsss.models.PixelResize`,
    whose backward is two more) or ``interpolate`` (the reference's ``F.interpolate``, whose backward on CUDA adds
    into the logits with atomics, up to 1,600 on one logit from the paper's 16x upsample; docs/reference.md)."""


@dataclass
class OptimConfig(Section):
    """AdamW with linear warm-up then polynomial decay."""

    KEY = "optim"

    lr: float = bounded(6e-5, POSITIVE)
    head_lr_mult: float = bounded(10.0, POSITIVE)
    weight_decay: float = bounded(0.01, NON_NEGATIVE)
    no_decay_1d: bool = False
    """Exempt 1-D parameters (norms, biases), ``pos_embed`` and ``cls_token`` from weight decay (timm's
    habit); the reference decays every trained parameter."""
    betas: tuple[float, float] = bounded((0.9, 0.999), Range(0, 1, high_open=True))
    warmup_iters: int = bounded(2500, NON_NEGATIVE)
    warmup_ratio: float = bounded(1e-6, UNIT)
    power: float = bounded(0.9, NON_NEGATIVE)


@dataclass
class TrainConfig(Section):
    """Loop length, batch, intervals."""

    KEY = "train"

    max_iters: int = bounded(80000, POSITIVE)
    batch_size: int = bounded(4, POSITIVE)
    """Images per process. Under ``torchrun`` every process draws its own batch and computes PAR, the pseudo labels
    and the balanced CE on it (gradients averaged), so the global batch is ``batch_size`` x the number of processes.
    The paper's batch 4 is 4 on one GPU, 2 on two (ToCo's run: 2 GPUs x 2 images), 1 on four; the splits differ
    only in how the balanced CE pools pixels (docs/reference.md row 13)."""
    seed: int = bounded(0, Range(0, 2**31 - 1, why="numpy takes seed + rank + iteration, below 2**32"))
    amp: bool = False
    """bf16 autocast of the training forward pass (and so of its backward) on a GPU; ignored on a CPU. Off: the
    reference's float32 (its products as ``fp32_precision`` says); on: bf16 products, the forward + backward's H100
    bound halved (docs/reference.md row 22; ``tools/train.py --amp``, as mmseg's)."""
    cam_dtype: str = choice("float32", "bfloat16")
    """Precision of the no-grad CAM pass that feeds the pseudo labels: ``float32`` (the reference) or
    ``bfloat16`` (autocast on a GPU, whatever ``amp``; ignored on a CPU)."""
    fp32_precision: str = choice(*FP32_PRECISIONS)
    """How a GPU computes the float32 matrix products and convolutions of a training run (the CAM pass with
    ``cam_dtype="float32"``, whatever ``amp`` leaves in float32, validation): ``tf32`` (the reference: its released
    run is torch 1.10 on A100s, whose default put them on TF32 tensor cores) or ``ieee`` (float32 throughout, several
    times slower; docs/reference.md row 21). Nothing changes on a CPU."""
    compile: bool = False
    """``torch.compile`` the model's forward pass of the training step (the CAM pass and validation run eagerly)."""
    cuda_graphs: bool = True
    """On one GPU (not under ``torchrun``, not with ``compile``), run each training iteration as a replayed CUDA graph
    (:mod:`wsss.engine.graphs`): the same kernels without the host's launch overhead. Off: every iteration eager."""
    cuda_graph_warmup: int = bounded(2, Range(1, 100))
    """Eager iterations of each kind of iteration before its graph is captured (:mod:`wsss.engine.graphs`)."""
    val_input: str = choice("crop", "original")
    """Validation input size: ``crop`` resizes each image to ``data.crop_size`` squared and the predictions
    back to the mask (the reference's logged numbers); ``original`` runs at the image's own size."""
    log_interval: int = bounded(50, POSITIVE)
    val_interval: int = bounded(5000, POSITIVE)
    ckpt_interval: int = bounded(5000, POSITIVE)
    max_keep_ckpts: int = bounded(3, Range(-1))
    """Newest ``iter_*.pth`` kept in the work dir, besides the best-validated and the last one; -1 keeps all."""
    val_max_images: int | None = bounded(None, POSITIVE)
    """Validate on the first this many val images; None: all."""
    chance_loss_ratio: float = bounded(0.9, NON_NEGATIVE)
    """Warn when the classification loss after the warm-up is still above this fraction of ln 2 (chance)."""


@dataclass
class CrfConfig(Section):
    """Dense CRF post-processing (Krähenbühl & Koltun 2011; docs/design.md section 3)."""

    KEY = "infer.crf"

    backend: str = choice("torch", "pydensecrf")
    """``torch``: the mean-field over a permutohedral lattice in PyTorch (:mod:`wsss.inference.crf.permutohedral`),
    on the device of the probabilities (on the CPU in ``workers`` processes), many images per call on a GPU;
    ``pydensecrf``: the reference C++ (pydensecrf2, which must be installed and needs a compiler to install), in
    ``workers`` processes. docs/reference.md row 19."""
    gaussian_sxy: float = bounded(1.0, POSITIVE)
    """Widths (``*_sxy`` in pixels, ``bilateral_srgb`` in colour levels) divide the features: > 0."""
    gaussian_compat: float = bounded(1.0, NON_NEGATIVE)
    """Weights of the two kernels (Potts compatibility): 0 switches a kernel off."""
    bilateral_sxy: float = bounded(121.0, POSITIVE)
    bilateral_srgb: float = bounded(5.0, POSITIVE)
    bilateral_compat: float = bounded(4.0, NON_NEGATIVE)
    iterations: int = bounded(10, ITERATIONS)
    kernel: str = choice(*CRF_KERNELS)
    """How the ``torch`` backend's mean-field runs its sparse products, the same sums either way (float32 rounding
    apart): ``fused`` (one Triton kernel per product, the prior and the softmax in the slices, and one for each
    lattice's simplices; CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``torch`` (PyTorch's sparse CSR products and
    operations, any device) or ``auto`` (the path measured faster on the device: torch on the CPU and, measured on an
    H200, on CUDA too, where the lattices' simplices come from their Triton kernel: the same lattice in fewer
    operations). docs/reference.md, the bullets after the table."""
    blur_directions: int = bounded(1, Range(1, CRF_BLUR_DIRECTIONS, why="the kernel's ceiling"))
    """Triton kernels (``kernel``): the lattice directions one launch blurs, each earlier direction's values computed
    where the next reads them instead of stored: the same float32 sums however many (tested bit for bit), fewer
    launches (12 per mean-field iteration at 1, 8 at 2, 6 at 3) and less memory traffic, but 3, 9 or 27 rows gathered
    per lattice point. docs/benchmarks.md, "Blurs of several directions in one launch"."""
    reference_padding: bool = True
    """``torch`` backend: add the lattice points pydensecrf's SSE build adds when an image's pixel count is not a
    multiple of 4 (padding points at feature 0, whose simplex joins the lattice and relays the blur), so the
    marginals equal the reference's; False, the filter without them. docs/reference.md row 19 measures both."""
    workers: int = bounded(2, WORKERS)
    """CRF processes of tools/infer.py and tools/test.py beside the model (0: in the calling process): the
    ``pydensecrf`` backend's, and the ``torch`` backend's on the CPU; on a GPU the ``torch`` backend runs in the
    calling process on the model's device and ignores it (:class:`wsss.inference.crf.CrfPool`)."""
    memory_mib: int = bounded(3072, Range(64, 2**20, why="64 MiB to 1 TiB"))
    """Budget of one CRF call's working memory, in MiB, on the CPU or the GPU. A call's estimate is its pixels x
    (:data:`~wsss.inference.crf.BYTES_PER_PIXEL` + :data:`~wsss.inference.crf.BYTES_PER_PIXEL_AND_CLASS` x classes), the
    measured worst case (on the Triton kernels' path, ``kernel=fused``, its own ``KERNEL_BYTES_PER_PIXEL...``: half as
    much at 21 classes); an image whose estimate exceeds the budget runs at the largest reduced resolution that fits
    (the kernel widths in pixels scaled with it, the marginals brought back to full size bilinearly), and a batch is
    split into calls that fit. 3072 keeps every VOC and COCO image (at most 640 x 480, 81 classes: 2.7 GiB) at its own
    size."""


@dataclass
class InferConfig(Section):
    """Test-time augmentation."""

    KEY = "infer"

    scales: tuple[float, ...] = bounded((1.0, 1.25, 1.5), SCALE, MAX_ITEMS)
    """TTA scales of the image the model sees (after ``max_size``): ``max_size`` x the largest is at most
    :data:`~wsss.config.validation.MAX_SIDE`."""
    flip: bool = True
    cls_thresh: float = bounded(0.5, UNIT)
    """A class counts as present (its CAM is drawn) when its classifier sigmoid exceeds this; when none does, the
    most probable class counts as present (the top-1 rule)."""
    mask_classes: str = choice("present", "all")
    """Which classes the mask may hold: ``present``, background and the classes present by ``cls_thresh`` and the
    top-1 rule (the argmax, and the CRF, run over those alone), so the mask, the CAMs shown and the image's
    ``present`` classes agree; ``all``, every class (the reference: ToCo's inference takes the argmax over all).
    Measured in docs/reference.md row 18: restricting raises the toy val mIoU."""
    fp32_precision: str = choice(*FP32_PRECISIONS)
    """How a GPU computes the model's float32 matrix products and convolutions at inference (``tools/test.py``,
    ``tools/infer.py``, the CAM pass of ``tools/make_pseudo_labels.py`` and ``tools/eval_cams.py``): ``tf32`` (the
    reference's, as ``train.fp32_precision``: DeiT-S at 3 scales + flip on a VOC image, 557 GFLOP, takes at least
    1.9 ms on an H100 with TF32 products, 6.7 ms with IEEE ones; its float32 attention is three TF32 products either
    way) or ``ieee`` (float32 throughout). The CRF's sums are float32 either way. Nothing changes on a CPU."""
    dtype: str = choice("float32", "bfloat16")
    """Precision of the model wherever ``fp32_precision`` applies: ``float32`` (the reference: its inference casts
    nothing) or ``bfloat16`` (bf16 autocast on a GPU: 0.56 ms for the image above, under a third of TF32's; ignored on
    a CPU, as ``train.cam_dtype``). The CRF, PAR and the masks' arithmetic stay float32. Measured in docs/reference.md
    row 23; a run records it, and a folder run or pseudo-label export resumed with the other one is a change of
    settings."""
    logits_stride: int = bounded(4, Range(0, 64, low_open=True))
    """Saved logits (``--logits``) are downscaled by this factor (> 0)."""
    max_size: int | None = bounded(1024, NON_NEGATIVE)
    """Longest image side the model sees; larger images are downscaled for the model and their masks brought back to
    the original size. 0: no cap of its own, every image at its own size up to the ceiling that holds whatever the
    value: :data:`~wsss.config.validation.MAX_SIDE` / the largest scale (1365 px at the default scales;
    :func:`wsss.inference.predictor.longest_side`). None, as checkpoints written before this default hold it: 1024.
    The default bounds the model's work and memory per image, which grow with the square of its tokens: a 12000 x
    12000 PNG (140 KB, under PIL's bomb limit) at its own size ran over 10 minutes at 6.3 GB and SIGTERM could not
    stop the op that ran; capped, it took 19 s on 2 CPU cores and SIGTERM ended it in 2 s. At 1024 the largest
    default TTA scale 1.5 gives a DeiT-S/16 at most 96 x 96 tokens (an op takes seconds on a CPU), while VOC (500
    px), COCO (640 px) and the 448 px training crops keep their own size. The outputs come back to full size in
    bands of ``max_size**2`` pixels, so no full-size float map is held (docs/benchmarks.md: that PNG peaks at 1.79
    GiB RSS, 6.20 GiB before)."""
    batch_size: int = bounded(16, Range(1, 1024, why="ceiling 1024"))
    """Most images of one size that run through the model together on a GPU in ``tools/infer.py`` and
    ``tools/test.py`` (``--batch-size`` sets it for one run of ``tools/infer.py``, on any device); the masks are those
    of one image at a time."""
    cpu_batch_size: int = bounded(1, Range(1, 1024, why="ceiling 1024"))
    """The same on the CPU, where batches gain nothing measurable (toy val, ``tools/test.py --tta --crf``: 4.10-4.18
    images/s at 1, 4.15-4.18 at 16; docs/benchmarks.md) and one image at a time keeps the progress bar per image and
    SIGTERM's wait to one image's longest operation."""
    batch_pixels: int = bounded(16 * 640 * 480, Range(1, 2**31, why="ceiling 2^31"))
    """Most pixels one such batch holds, counted at the size the model sees at scale 1 (after ``max_size``): images of
    ``h x w`` pixels run ``min(batch_size, max(1, batch_pixels // (h w)))`` at a time. The default, 16 COCO-sized 640 x
    480 images, runs VOC and COCO images 16 at a time and a 1024 x 1024 one 4 at a time, so a batch's memory stays
    that of 16 COCO images (3,845 MiB at 3 scales + flip + CRF with every class; docs/benchmarks.md) whatever the
    images' size."""
    crf: CrfConfig = field(default_factory=CrfConfig)

    def __post_init__(self) -> None:
        if self.max_size is None:
            self.max_size = type(self).max_size
        super().__post_init__()
        if self.max_size and self.max_size * max(self.scales) > MAX_SIDE:
            raise ConfigError(
                f"config keys 'infer.max_size' ({self.max_size}) and 'infer.scales' ({list(self.scales)}): the model "
                f"would see {self.max_size * max(self.scales):g} px, above the ceiling of {MAX_SIDE} px (attention's "
                "work grows with the square of the tokens); lower the largest scale or max_size"
            )


@dataclass
class PretrainConfig(Section):
    """Classification pre-training of the backbone (``tools/pretrain.py``); WSSS training never reads it."""

    KEY = "pretrain"

    labels: str = choice("image", "crop")
    """A crop's targets: ``image``, the image's labels (``data.label_file``), as WSSS training uses them; or
    ``crop``, the classes that cover at least ``crop_label_min_fraction`` of the crop in its mask, for a
    pre-training set whose masks are generated with it (the toy sets), as ImageNet's labels name what an
    object-centred image shows."""
    crop_label_min_fraction: float = bounded(0.02, UNIT)
    """Share of the crop's pixels a class must cover to be a ``crop`` label."""


@dataclass
class GpuCheckConfig(Section):
    """``make gpu-check`` (:mod:`wsss.gpu_check`): sizes and limits of the comparisons on a real GPU."""

    KEY = "gpu_check"

    tolerance: float = bounded(1e-3, FRACTION)
    """Largest relative difference (norm of the difference over the norm) of a CUDA result from its reference."""
    crop_size: int = bounded(224, SIDE)
    """Input edge of the model comparisons (the step's terms on CUDA and CPU, timm's ViT)."""
    energy_points: tuple[int, ...] = bounded((300, 100), Range(1, 4096), MAX_ITEMS)
    """Sizes of the energy-filter comparisons with brute force (those of tests/test_energy_kernel.py)."""
    energy_channels: tuple[int, ...] = bounded((21, 4), Range(1, 256), MAX_ITEMS)
    energy_offsets: tuple[float, ...] = bounded((3.0, 500.0), FINITE, MAX_ITEMS)
    """A common offset of the features (the kernel centres them)."""
    energy_side: int = bounded(224, SIDE)
    """Fused against blocked on a ``energy_side`` squared grid: the paper's 448 crop at ``loss.reg_scale`` 0.5."""
    image_size: tuple[int, int] = bounded((375, 500), SIDE)
    """(H, W) of the images the Segmenter and the evaluator compare on (a typical VOC photo)."""
    min_mask_agreement: float = bounded(0.999, UNIT)
    """Smallest fraction of mask pixels equal on CUDA and the CPU."""
    tf32_side: int = bounded(512, SIDE)
    min_tf32_error_ratio: float = bounded(16.0, Range(1, 1e6))
    """A ``tf32_side`` squared float32 product with ``fp32_precision("tf32")`` errs (from float64) at least this many
    times more than with ``"ieee"``: TF32 engaged (its operands keep 10 mantissa bits of float32's 23: about 2^13
    times the error)."""
    crf_tolerance: float = bounded(1e-4, FRACTION)
    """Largest gap of the torch CRF's marginals on CUDA from the CPU's (the bound on its gap to pydensecrf)."""
    part_timeout: float = bounded(300.0, Range(0, 86400, low_open=True, why="ceiling one day"))
    """Seconds each subprocess (benchmark, toy set, torchrun) may take."""
    toy_images: int = bounded(16, Range(1, 10000))
    ddp_iters: int = bounded(30, Range(2, 10000))
    ddp_resume_from: int = bounded(20, POSITIVE)
    """Below ``ddp_iters``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        sizes = {len(self.energy_points), len(self.energy_channels), len(self.energy_offsets)}
        if len(sizes) != 1:
            raise ConfigError(
                "config keys 'gpu_check.energy_points', 'energy_channels' and 'energy_offsets': give as many of each, "
                f"got {list(self.energy_points)}, {list(self.energy_channels)}, {list(self.energy_offsets)}"
            )
        check_range("gpu_check.ddp_resume_from", self.ddp_resume_from, Range(1, self.ddp_iters - 1))


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
