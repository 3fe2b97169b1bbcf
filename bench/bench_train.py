"""Training-step speed and memory at the paper setting, broken down by stage.

DeiT-S/16 with centered attention, batch 4, 448 crops, 3-scale + flip CAM, dual-threshold PAR pseudo labels,
balanced CE and the dense energy loss: the real :class:`wsss.engine.step.TrainingStep` on random crops, then each of
its stages timed alone with the same inputs.

    python bench/bench_train.py [--device cpu|cuda] [--batch 4] [--size 448] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from _common import rss_bytes, synchronize

from wsss.cam import multiscale_cam
from wsss.config import load_config
from wsss.data.transforms import backbone_mean_std, denormalize
from wsss.engine.step import TrainingStep
from wsss.losses import balanced_seg_ce, multilabel_soft_margin
from wsss.models import build_model
from wsss.pseudo_label import boxes_to_mask, pseudo_labels


def timed(fn, repeats: int, device: torch.device) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls (after one warm-up call) and its last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        tic = time.perf_counter()
        out = fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return statistics.median(times), out


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return rss_bytes("VmHWM") / 2**20  # the process's peak resident memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    opts = {"model.pretrained": "", "train.batch_size": args.batch, "data.crop_size": args.size}
    cfg = load_config(args.config, opts)
    mean, std = backbone_mean_std(cfg.model.backbone)
    num_classes = len(cfg.data.classes) if isinstance(cfg.data.classes, list) else 21
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes).to(device).train()
    o = cfg.optim
    optimizer = torch.optim.AdamW(model.param_groups(o.lr, o.head_lr_mult, o.weight_decay, o.no_decay_1d))
    b, s = args.batch, args.size
    batch = {
        "image": torch.randn(b, 3, s, s, device=device),
        "label": (torch.rand(b, num_classes - 1, device=device) < 0.15).float(),
        "box": torch.tensor([[0, s, 0, s]] * b, device=device),
    }
    batch["label"][:, 0] = 1.0  # at least one class per image
    step = TrainingStep(cfg, mean, std, device)
    amp = step.amp

    def full_step() -> None:
        loss, _ = step(model, model, batch, cfg.loss.seg_start_iter)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def forward_backward() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(batch["image"])
        loss = multilabel_soft_margin(out.logits.float(), batch["label"])
        loss = loss + multilabel_soft_margin(out.aux_logits.float(), batch["label"]) + out.seg.float().mean()
        loss.backward()

    def cam() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=step.cam_autocast):
            return multiscale_cam(model.cam, batch["image"], batch["label"], cfg.cam.scales)

    rows = {}
    rows["full step (TrainingStep + backward + AdamW)"], _ = timed(full_step, args.repeats, device)
    rows["forward + backward (cls, aux, decoder)"], _ = timed(forward_backward, args.repeats, device)
    rows[f"CAM ({len(cfg.cam.scales)} scales + flip, no grad)"], cams = timed(cam, args.repeats, device)
    rgb = denormalize(batch["image"], mean, std)
    valid = boxes_to_mask(batch["box"], s, s)

    def pseudo() -> torch.Tensor:
        return pseudo_labels(
            rgb, cams, batch["label"], valid, step.par, cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.par.scale,
            cfg.data.ignore_index,
        )  # fmt: skip

    rows[f"pseudo labels (PAR, {cfg.par.num_iter} iterations)"], target = timed(pseudo, args.repeats, device)
    seg = torch.randn(b, num_classes, s // 16, s // 16, device=device, requires_grad=True)

    def seg_loss() -> None:
        up = F.interpolate(seg, size=(s, s), mode="bilinear", align_corners=False)
        balanced_seg_ce(up, target, cfg.data.ignore_index).backward()

    def energy() -> None:
        up = F.interpolate(seg, size=(s, s), mode="bilinear", align_corners=False)
        step.energy(rgb * 255.0, up.softmax(dim=1), valid, target).backward()

    rows["seg CE forward + backward"], _ = timed(seg_loss, args.repeats, device)
    rows[f"energy loss forward + backward (scale {cfg.loss.reg_scale})"], _ = timed(energy, args.repeats, device)
    total = rows["full step (TrainingStep + backward + AdamW)"]
    print(f"{cfg.model.backbone} / {cfg.model.attention.name}, batch {b}, {s}x{s}, device {device}, "
          f"threads {torch.get_num_threads()}, bf16 autocast {amp}")  # fmt: skip
    print("| stage | seconds | share of full step |")
    print("|---|---:|---:|")
    for name, sec in rows.items():
        print(f"| {name} | {sec:.3f} | {sec / total:.0%} |")
    print(f"iterations/s: {1 / total:.3f}; 80k iterations: {80000 * total / 3600:.1f} h")
    print(f"peak memory: {peak_memory_mib(device):.0f} MiB ({'CUDA allocated' if device.type == 'cuda' else 'RSS'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
