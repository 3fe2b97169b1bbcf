"""The measured effect of each default that follows the reference (ToCo's released training) instead of our
earlier choice: the numbers behind docs/reference.md.

    python bench/reference_effects.py --checkpoint work_dirs/toy_centered/iter_600.pth [--threads 2]

Two models are measured: DeiT-S/16 at the paper setting (448 crops; random init, since the pretrained weights
cannot be downloaded here) and a trained toy checkpoint (``make demo``), whose CAMs are real. Inputs are toy
images (``data/toy_voc``). Every number is printed as a markdown row.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import statistics
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from wsss.cam import multiscale_cam
from wsss.config import Config, DataConfig, load_config
from wsss.data.transforms import TrainAugment, backbone_mean_std, denormalize
from wsss.data.voc import VOCClsDataset, VOCSegDataset, read_split
from wsss.energy_kernel import round_tf32
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.validate import validate
from wsss.evaluation.cam_eval import evaluate_cams
from wsss.evaluation.metrics import ConfusionMatrix
from wsss.inference.predictor import Segmenter
from wsss.model_file import config_from_checkpoint, load_checkpoint
from wsss.models import WSSSModel, build_model
from wsss.pseudo_label import boxes_to_mask, pseudo_labels
from wsss.utils.fileio import read_mask


def row(what: str, value: str) -> None:
    print(f"| {what} | {value} |")


def batch_from(dataset: VOCClsDataset, count: int) -> dict:
    items = [dataset[i] for i in range(count)]
    batch = {k: torch.stack([it[k] for it in items]) for k in ("image", "label", "box")}
    return {**batch, "image": dataset.normalize()(batch["image"])}


def changed(a: torch.Tensor, b: torch.Tensor, region: torch.Tensor | None = None) -> float:
    """Percent of pixels (inside ``region``) whose pseudo label differs."""
    diff = a != b
    return 100.0 * float(diff[region].float().mean() if region is not None else diff.float().mean())


def pseudo(model: WSSSModel, cfg: Config, batch: dict, mean, std, cam_autocast: bool = False) -> torch.Tensor:
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cam_dtype="float32"))
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    step.cam_autocast = cam_autocast  # bf16 autocast runs on the CPU too
    return step.targets(model, batch).label


def drop_path_effect(name: str, state: dict, cfg: Config, batch: dict, mean, std) -> None:
    """Pixels of pseudo labels that change between two no-grad CAM passes in train mode (as in training)."""
    num_classes = batch["label"].shape[1] + 1
    for rate in (0.0, 0.1):
        model = build_model(dataclasses.replace(cfg.model, drop_path_rate=rate), num_classes)
        model.load_state_dict(state)
        model.train()
        torch.manual_seed(0)
        a = pseudo(model, cfg, batch, mean, std)
        b = pseudo(model, cfg, batch, mean, std)
        row(f"{name}: pseudo-label pixels changed between two passes, drop_path_rate {rate}", f"{changed(a, b):.2f} %")


def padding_effect(model: WSSSModel, cfg: Config, dataset: VOCClsDataset, mean, std, count: int) -> None:
    """In-box pseudo-label pixels that change when the crop's padding is ImageNet-mean grey instead of black
    (the same crops otherwise: the augmentation is a function of the seed)."""
    labels = []
    for pad in ((0.0, 0.0, 0.0), tuple(255.0 * m for m in mean)):
        dataset.augment = TrainAugment(dataclasses.replace(cfg.data, pad_rgb=pad, scale_range=(0.5, 0.5)), mean, std)
        batch = batch_from(dataset, count)
        labels.append(pseudo(model.eval(), cfg, batch, mean, std))
    box = TrainingStep(cfg, mean, std, torch.device("cpu")).targets(model, batch).valid
    row(f"toy: crop area that is padding (scale 0.5, {count} crops)", f"{100 * float((~box).float().mean()):.1f} %")
    row("toy: in-box pseudo-label pixels changed, grey instead of black padding", f"{changed(*labels, box):.2f} %")


def paper_padding_fraction(samples: int) -> None:
    """Share of a 448 crop that is padding at the paper setting, for a 500 x 375 image (VOC's most common size)."""
    aug = TrainAugment(DataConfig(color_jitter_prob=0, grayscale_prob=0, blur_prob=0), (0.0,) * 3, (1.0,) * 3)
    image = np.zeros((375, 500, 3), np.uint8)
    fractions = []
    for seed in range(samples):
        y0, y1, x0, x1 = aug(image, None, seed).box
        fractions.append(1.0 - (y1 - y0) * (x1 - x0) / 448**2)
    crops_padded = 100.0 * np.mean([f > 0 for f in fractions])
    row(f"paper setting: crops with padding ({samples} crops of a 500x375 image)", f"{crops_padded:.0f} %")
    row("paper setting: mean share of the crop that is padding", f"{100 * statistics.mean(fractions):.1f} %")


def init_effect(cfg: Config, images: torch.Tensor) -> None:
    """Initial weights and segmentation logits of the reference init against ``model.head_init="kaiming"``."""
    stats = {}
    for init in ("default", "kaiming"):
        torch.manual_seed(0)  # the same backbone weights for both
        model = build_model(dataclasses.replace(cfg.model, head_init=init), 21).eval()
        with torch.no_grad():
            seg = model(images).seg
        stats[init] = [float(t.detach().std()) for t in (model.decoder.cls.weight, seg, model.classifier.conv.weight)]
    (w_ref, seg_ref, cls_ref), (w_k, seg_k, cls_k) = stats["default"], stats["kaiming"]
    row("DeiT-S 448: std of the last decoder weight, default / kaiming", f"{w_ref:.4f} / {w_k:.4f}")
    row("DeiT-S 448: std of the initial seg logits, default / kaiming", f"{seg_ref:.3f} / {seg_k:.3f} "
        f"({seg_k / seg_ref:.1f}x)")  # fmt: skip
    row("DeiT-S: classifier weight std, default / kaiming", f"{cls_ref:.4f} / {cls_k:.4f} ({cls_k / cls_ref:.1f}x)")


def weight_decay_effect(cfg: Config) -> None:
    model = build_model(cfg.model, 21)
    o = cfg.optim
    count = {}
    for no_decay in (False, True):
        groups = model.param_groups(o.lr, o.head_lr_mult, o.weight_decay, no_decay)
        count[no_decay] = sum(p.numel() for g in groups if g["weight_decay"] > 0 for p in g["params"])
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    row("DeiT-S: parameters under weight decay, reference / earlier (1-D and tokens exempt)",
        f"{count[False]:,} / {count[True]:,}")  # fmt: skip
    row("DeiT-S: parameters frozen by the reference (pos_embed)", f"{frozen:,}")


def tf32(x, truncate: bool):
    """A float32 tensor's values as TF32 holds them (10 mantissa bits): rounded to nearest (ties away, PTX's
    ``cvt.rna.tf32.f32``), or with ``truncate`` the lower 13 bits cut (PyTorch's note: "only the first 10 bits of the
    input mantissa are read"); anything else unchanged."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        return x
    return (x.view(torch.int32) & -0x2000).view(torch.float32) if truncate else round_tf32(x)


class TF32Products(TorchFunctionMode):
    """The CPU computing as a GPU's TF32 tensor cores do (``train.fp32_precision="tf32"``): the operands of every
    float32 matrix product and convolution rounded to TF32 (:func:`tf32`), the sums in float32, a bias added
    unrounded. ``F.scaled_dot_product_attention`` becomes its two products, each with TF32 operands (the softmax in
    float32)."""

    PRODUCTS = {F.linear, F.conv2d, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
                torch.Tensor.__rmatmul__, torch.mm, torch.bmm, torch.Tensor.mm, torch.Tensor.bmm}  # fmt: skip
    """Functions whose first two arguments are a product's operands (a bias, the third, stays float32)."""

    def __init__(self, truncate: bool = False):
        super().__init__()
        self.truncate = truncate
        self.products = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = (tf32(t, self.truncate) for t in args[:3])
            if len(args) > 3 or set(kwargs) - {"scale", "dropout_p"} or kwargs.get("dropout_p", 0.0):
                raise NotImplementedError("TF32Products: attention with a mask or dropout")
            scale = kwargs.get("scale") or q.shape[-1] ** -0.5
            attn = (torch.matmul(q, k.transpose(-2, -1)) * scale).softmax(dim=-1)
            self.products += 2
            return torch.matmul(tf32(attn, self.truncate), v)
        if func in self.PRODUCTS:
            args = (*(tf32(a, self.truncate) for a in args[:2]), *args[2:])
            self.products += 1
        return func(*args, **kwargs)


def cam_precision_effect(name: str, model: WSSSModel, cfg: Config, batch: dict, mean, std) -> None:
    """Pseudo labels of the CAM pass in bf16 (autocast) and with TF32 products (emulated) against float32."""
    model.train()
    a = pseudo(model, cfg, batch, mean, std)
    b = pseudo(model, cfg, batch, mean, std, cam_autocast=True)
    row(f"{name}: pseudo-label pixels equal, bf16 CAM pass vs fp32", f"{100 - changed(a, b):.3f} % "
        f"({int((a != b).sum())} of {a.numel()} differ)")  # fmt: skip
    for truncate in (False, True):
        with TF32Products(truncate) as mode:
            c = pseudo(model, cfg, batch, mean, std)
        row(f"{name}: pseudo-label pixels equal, TF32 products ({'truncated' if truncate else 'rounded'}; "
            f"{mode.products} products) vs fp32", f"{100 - changed(a, c):.3f} % ({int((a != c).sum())} of "
            f"{a.numel()} differ)")  # fmt: skip
    threads = torch.get_num_threads()
    if threads > 1:  # the float32 pass's own summation order: another thread count splits its sums otherwise
        torch.set_num_threads(1)
        d = pseudo(model, cfg, batch, mean, std)
        torch.set_num_threads(threads)
        row(f"{name}: pseudo-label pixels equal, fp32 CAM pass on 1 thread vs {threads}",
            f"{100 - changed(a, d):.3f} % ({int((a != d).sum())} of {a.numel()} differ)")  # fmt: skip


def amp_effect(name: str, model: WSSSModel, cfg: Config, batch: dict, mean, std) -> None:
    """One training step with every term on, its forward pass under bf16 autocast (``train.amp``, on the CPU as a GPU
    would run it) against float32 (the reference): the loss terms and the gradient, the CAM pass float32 in both."""
    grads, terms = {}, {}
    for amp in (False, True):
        trained = copy.deepcopy(model).train()
        step = TrainingStep(cfg, mean, std, torch.device("cpu"))
        step.amp = amp
        torch.manual_seed(0)
        loss, found = step(trained, trained, batch, cfg.loss.seg_start_iter)
        loss.backward()
        terms[amp] = {k: v.detach() for k, v in found.items()}
        grads[amp] = torch.cat([p.grad.flatten() for p in trained.parameters() if p.grad is not None]).double()
    a, b = grads[False], grads[True]
    gap = ", ".join(f"{k} {float((terms[True][k] - v).abs() / v.abs()):.1e}" for k, v in terms[False].items())
    row(f"{name}: one step, bf16 autocast (train.amp) vs float32: loss terms (relative)", gap)
    row(f"{name}: one step, bf16 autocast (train.amp) vs float32: gradient",
        f"relative {float((b - a).norm() / a.norm()):.1e}, cosine {float(a @ b / (a.norm() * b.norm())):.5f}")


def infer_precision_effect(checkpoint: str, cfg: Config, count: int) -> None:
    """Masks of the :class:`~wsss.inference.predictor.Segmenter` (the checkpoint's ``infer.*``: its scales + flip)
    on the first ``count`` val images with TF32 products (emulated, :class:`TF32Products`) and under bf16 autocast
    (``infer.dtype="bfloat16"``, on the CPU as a GPU would run it) against float32: pixels that differ, and mIoU each
    way."""
    segmenter = Segmenter.from_checkpoint(checkpoint, device="cpu")
    root = Path(cfg.data.root)
    ids = read_split(root / "ImageSets" / "Segmentation" / f"{cfg.data.val_split}.txt")[:count]
    masks, scores = {}, {}
    modes = (("fp32", contextlib.nullcontext()), ("TF32 products", TF32Products()),
             ("bf16 autocast (infer.dtype)", torch.autocast("cpu", dtype=torch.bfloat16)))  # fmt: skip
    for name, mode in modes:
        cm = ConfusionMatrix(len(segmenter.classes))
        with mode:
            masks[name] = [segmenter(root / "JPEGImages" / f"{i}.jpg").mask for i in ids]
        for i, mask in zip(ids, masks[name], strict=True):
            cm.update(mask, read_mask(root / cfg.data.mask_dir / f"{i}.png"))
        scores[name] = cm.compute()["mIoU"]
    total = sum(m.size for m in masks["fp32"])
    for name, _ in modes[1:]:
        differ = sum(int((a != b).sum()) for a, b in zip(masks["fp32"], masks[name], strict=True))
        row(f"toy (trained), {count} val images, masks at infer.scales + flip: pixels that differ, {name} vs fp32",
            f"{differ} of {total}; mIoU {scores[name]:.2f} against {scores['fp32']:.2f}")  # fmt: skip


def cam_alignment_effect(model: WSSSModel, cfg: Config, dataset: VOCClsDataset, mean, std, crop: int) -> None:
    """The earlier training CAM stretched the token grid of a padded input over the crop; now it is aligned."""
    data = dataclasses.replace(cfg.data, crop_size=crop)
    dataset.augment = TrainAugment(data, mean, std)
    batch = batch_from(dataset, 4)
    model.eval()
    with torch.no_grad():
        aligned = multiscale_cam(model.cam, batch["image"], batch["label"], cfg.cam.scales)
        stretched = multiscale_cam(lambda x: model.classifier.cam(model(x).features), batch["image"], batch["label"],
                                   cfg.cam.scales)  # fmt: skip
    row(f"toy: CAM difference, stretched vs aligned token grid (crop {crop}, patch {model.stride})",
        f"max {float((aligned - stretched).abs().max()):.2f}, mean {float((aligned - stretched).abs().mean()):.3f}")


def validation_effect(model: WSSSModel, cfg: Config, mean, std, count: int) -> None:
    val = VOCSegDataset(cfg.data, mean, std)
    for mode in ("crop", "original"):
        run = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, val_input=mode))
        res = validate(model, val, run, torch.device("cpu"), max_images=count, num_pictures=0)
        summary = ", ".join(f"{k} {v:.1f}" for k, v in res.metrics.items())
        row(f"toy val ({count} images), val_input={mode}", summary)


def pos_embed_effect(name: str, state: dict, cfg: Config, batch: dict, mean, std, val_images: int = 0) -> None:
    """The reference's plain bicubic position-embedding resampling against timm's antialiased kernel, same weights
    and crops: classifier logits, CAMs and pseudo labels of the training CAM pass; with ``val_images``, validation."""
    num_classes = batch["label"].shape[1] + 1
    out = {}
    for interp in ("bicubic", "timm"):
        run = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pos_embed_interp=interp))
        model = build_model(run.model, num_classes)
        model.load_state_dict(state)
        model.train()  # as the training CAM pass runs
        with torch.no_grad():
            logits = model(batch["image"]).logits
        step = TrainingStep(dataclasses.replace(run, train=dataclasses.replace(run.train, cam_dtype="float32")),
                            mean, std, torch.device("cpu"))  # fmt: skip
        out[interp] = (logits, step.targets(model, batch))
        if val_images:
            val = VOCSegDataset(run.data, mean, std)
            res = validate(model.eval(), val, run, torch.device("cpu"), max_images=val_images, num_pictures=0)
            row(f"{name}: val ({val_images} images), pos_embed_interp={interp}",
                ", ".join(f"{k} {v:.2f}" for k, v in res.metrics.items()))  # fmt: skip
    (la, ta), (lb, tb) = out["bicubic"], out["timm"]
    rel = float((la - lb).abs().max() / la.abs().max())
    row(f"{name}: bicubic vs timm resampling, classifier logits (max relative)", f"{rel:.1e}")
    row(f"{name}: bicubic vs timm resampling, CAM max abs difference", f"{float((ta.cams - tb.cams).abs().max()):.1e}")
    pixels = int((ta.label != tb.label).sum())
    row(f"{name}: bicubic vs timm resampling, pseudo-label pixels changed",
        f"{pixels} of {ta.label.numel()} ({changed(ta.label, tb.label):.2f} %)")  # fmt: skip


def warmup_effect(cfg: Config) -> None:
    """Learning rate (x base) at ``loss.seg_start_iter`` and summed over the schedule: the paper's warm-up against
    the reference's 1500 iterations (``PolyWarmupScheduler`` stepped over every iteration)."""
    factors = {}
    for warmup in (cfg.optim.warmup_iters, 1500):
        o = dataclasses.replace(cfg.optim, warmup_iters=warmup)
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=o.lr)
        sched = PolyWarmupScheduler(opt, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
        rates = []
        for _ in range(cfg.train.max_iters):
            rates.append(opt.param_groups[0]["lr"] / o.lr)  # the rate this iteration steps with
            opt.step()
            sched.step()
        factors[warmup] = rates
    (a, ra), (b, rb) = factors.items()
    it = cfg.loss.seg_start_iter
    row(f"paper schedule: lr at iteration {it} (x base), warm-up {a} / {b}", f"{ra[it]:.4f} / {rb[it]:.4f}")
    row(f"paper schedule: sum of lr / base over {cfg.train.max_iters} iterations, warm-up {a} / {b}",
        f"{sum(ra):.1f} / {sum(rb):.1f} ({sum(rb) - sum(ra):.1f} base-rate iterations)")  # fmt: skip


def val_subset_effect(model: WSSSModel, cfg: Config, mean, std, counts: tuple[int, ...]) -> None:
    """Seg mIoU over the classes in the ground truth or the prediction (ours, mmseg's) against the ground truth
    only (the reference's), on the first ``count`` val images."""
    val = VOCSegDataset(cfg.data, mean, std)
    for count in counts:
        table = validate(model.eval(), val, cfg, torch.device("cpu"), max_images=count, num_pictures=0).tables["seg"]
        iou = np.asarray(table.per_class["IoU"], dtype=float)
        in_gt = np.asarray(table.per_class["Acc"], dtype=float)  # Acc is NaN for a class absent from the ground truth
        ours, gt_only = np.nanmean(iou), np.nanmean(iou[~np.isnan(in_gt)])
        row(f"toy val, first {count} images: seg mIoU ours / ground-truth classes only", f"{ours:.2f} / {gt_only:.2f}")


def par_guidance_effect(name: str, model: WSSSModel, cfg: Config, batch: dict, mean, std) -> None:
    """Pseudo labels with the float PAR guidance image (ours) against the reference's uint8-truncated one, on the
    same CAMs."""
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    model.train()
    with torch.no_grad():
        images = batch["image"].float()
        cams = multiscale_cam(model.cam, images, batch["label"], cfg.cam.scales)
        scale, shift = (torch.tensor(v).view(1, 3, 1, 1) * 255 for v in (std, mean))
        truncated = (images * scale + shift).to(torch.uint8) / 255.0
        valid = boxes_to_mask(batch["box"], *images.shape[-2:])
        args = (cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.par.scale, cfg.data.ignore_index, None)
        ours = pseudo_labels(denormalize(images, mean, std), cams, batch["label"], valid, step.par, *args)
        ref = pseudo_labels(truncated, cams, batch["label"], valid, step.par, *args)
    row(f"{name}: pseudo-label pixels changed, uint8-truncated PAR guidance",
        f"{int((ours != ref).sum())} of {ours.numel()}")  # fmt: skip


def pseudo_scoring(model: WSSSModel, cfg: Config, mean, std, count: int) -> None:
    train = VOCSegDataset(cfg.data, mean, std, split=cfg.data.train_split)
    res = evaluate_cams(model, train, cfg, [cfg.cam.infer_bg_thresh], pseudo=True, max_images=count, progress=False)
    row(f"toy train ({count} images): pseudo mIoU on certain pixels (uncertain share)",
        f"{res.pseudo['mIoU']:.1f} ({100 * res.pseudo_ignored_fraction:.1f} % uncertain)")  # fmt: skip
    row(f"toy train ({count} images): pseudo mIoU on every pixel (paper-comparable)", f"{res.pseudo_all['mIoU']:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="work_dirs/toy_centered/iter_600.pth", help="a trained toy checkpoint")
    parser.add_argument("--paper-config", default="configs/voc_centered.py")
    parser.add_argument("--images", type=int, default=4, help="crops per measurement")
    parser.add_argument("--val-images", type=int, default=100)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--pos-embed-only", action="store_true", help="only the position-embedding resampling rows")
    parser.add_argument("--precision-only", action="store_true",
                        help="only the precision rows: the CAM pass, inference and the step's bf16 autocast")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    ckpt = load_checkpoint(args.checkpoint)
    toy_cfg = config_from_checkpoint(ckpt)
    mean, std = tuple(ckpt["mean"]), tuple(ckpt["std"])
    toy_data = VOCClsDataset(toy_cfg.data, mean, std, seed=0)
    toy_batch = batch_from(toy_data, args.images)
    toy_model = build_model(toy_cfg.model, len(ckpt["classes"]))
    toy_model.load_state_dict(ckpt["model"])

    paper = load_config(args.paper_config, {"model.pretrained": ""})
    # DeiT-S sees toy images scaled 2x into 448 crops (VOC is not here), with the paper's normalisation
    paper_data = dataclasses.replace(toy_cfg.data, crop_size=448, scale_range=(2.0, 2.0))
    paper = dataclasses.replace(paper, data=paper_data)
    pmean, pstd = backbone_mean_std(paper.model.backbone)
    paper_batch = batch_from(VOCClsDataset(paper_data, pmean, pstd, seed=0), 2)
    torch.manual_seed(0)
    paper_model = build_model(paper.model, len(ckpt["classes"]))

    print("| measurement | value |\n|---|---|")
    if args.precision_only:
        cam_precision_effect("DeiT-S 448 (random init)", paper_model, paper, paper_batch, pmean, pstd)
        cam_precision_effect("toy (trained)", toy_model, toy_cfg, toy_batch, mean, std)
        infer_precision_effect(args.checkpoint, toy_cfg, args.val_images)
        amp_effect("DeiT-S 448 (random init)", paper_model, paper, paper_batch, pmean, pstd)
        amp_effect("toy (trained)", toy_model, toy_cfg, toy_batch, mean, std)
        return 0
    pos_embed_effect("DeiT-S 448 (random init)", paper_model.state_dict(), paper, paper_batch, pmean, pstd)
    pos_embed_effect("toy (trained)", ckpt["model"], toy_cfg, toy_batch, mean, std, args.val_images)
    if args.pos_embed_only:
        return 0
    warmup_effect(paper)
    val_subset_effect(toy_model, toy_cfg, mean, std, (2, 5, 10, args.val_images))
    par_guidance_effect("toy (trained), 16 crops", toy_model, toy_cfg, batch_from(toy_data, 16), mean, std)
    par_guidance_effect("DeiT-S 448 (random init)", paper_model, paper, paper_batch, pmean, pstd)
    drop_path_effect("DeiT-S 448 (random init)", paper_model.state_dict(), paper, paper_batch, pmean, pstd)
    drop_path_effect("toy (trained)", ckpt["model"], toy_cfg, toy_batch, mean, std)
    paper_padding_fraction(samples=500)
    padding_effect(toy_model, toy_cfg, toy_data, mean, std, args.images)
    init_effect(paper, paper_batch["image"])
    weight_decay_effect(paper)
    cam_precision_effect("DeiT-S 448 (random init)", paper_model, paper, paper_batch, pmean, pstd)
    cam_precision_effect("toy (trained)", toy_model, toy_cfg, toy_batch, mean, std)
    infer_precision_effect(args.checkpoint, toy_cfg, args.val_images)
    amp_effect("DeiT-S 448 (random init)", paper_model, paper, paper_batch, pmean, pstd)
    amp_effect("toy (trained)", toy_model, toy_cfg, toy_batch, mean, std)
    cam_alignment_effect(toy_model, toy_cfg, toy_data, mean, std, crop=toy_cfg.data.crop_size + toy_model.stride // 2)
    validation_effect(toy_model, toy_cfg, mean, std, args.val_images)
    pseudo_scoring(toy_model, toy_cfg, mean, std, args.val_images)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
