"""The training step on paper: FLOPs and bytes per stage at the paper setting, and the H100 lower bound of each;
then the model alone at inference on a VOC-sized image, the most images/s each precision allows.

    python bench/step_on_paper.py [--config configs/voc_centered.py]

Counts come from DeiT-S/16's shapes (:data:`VIT`, the paper's backbone; not read from the config) and the
config's crop, batch, CAM scales, PAR, energy scale, decoder width and classes; nothing is run. A
multiply-add counts as 2 FLOPs. The lower bound of a stage is the largest of its times at the peak rates
below (a model pass: its products' time plus its attention's, at the rate PyTorch's attention kernels reach in its
precision); real kernels reach a fraction of them, so the bounds say which stage cannot fit a budget, not what a
stage will take.
"""

from __future__ import annotations

import argparse
import math

from wsss.config import load_config

# NVIDIA H100 SXM5 (datasheet; dense tensor-core rates, i.e. without sparsity)
H100 = {
    "bf16 tensor": 989.4e12,
    "tf32 tensor": 494.7e12,
    "fp32 cuda cores": 66.9e12,  # FLOP/s with FMA = 2
    "hbm": 3.35e12,  # bytes/s
    "exp2": 16 * 132 * 1.98e9,  # SFU results/s: 16 per SM per clock (compute capability 9.0), 132 SMs, 1.98 GHz
    "fp32 instructions": 128 * 132 * 1.98e9,  # FP32 lanes per SM x SMs x clock
}
H100["fp32 attention"] = H100["tf32 tensor"] / 3
"""Float32 attention, at any ``fp32_precision``: of PyTorch's ``scaled_dot_product_attention`` kernels only the
memory-efficient one takes float32 (flash and cuDNN attention take 16-bit types), and from sm_80 on it multiplies
float32 operands as three TF32 products on the tensor cores (CUTLASS's ``OpMultiplyAddFastF32``, its
``DefaultGemmType`` for float), whatever the TF32 flags say: a third of the TF32 rate. bf16 attention runs at the bf16
rate (flash attention)."""
PRODUCT_RATES = {"ieee": "fp32 cuda cores", "tf32": "tf32 tensor", "bf16": "bf16 tensor"}
"""The rate of a model's other products (linear layers, convolutions) in each precision."""
VIT = {"patch": 16, "dim": 384, "depth": 12, "mlp_ratio": 4}  # DeiT-S/16
PAR_NEIGHBOURS_PER_DILATION = 8
LATTICE_REAL_SHARE = 14965 / 1204224
"""Real points of the energy's fixed-box lattice among its N (d+1): four 224 x 224 photograph crops at the paper's
sigmas (docs/benchmarks.md, "The energy by the reference's lattice")."""
LATTICE_BUILD_BYTES = 80
"""Traffic of the build per fixed point: its code sorted (int32 keys and values, about four passes: 32 bytes) and
its d + 1 = 6 neighbours searched and stored (int32: 48 bytes)."""


def vit_forward_flops(tokens: int, dim: int, depth: int, mlp_ratio: int) -> tuple[float, float]:
    """One image through the blocks: ``(linear, attention)``, the products of qkv, proj and the MLP; q k^T and a v."""
    linear = 2 * tokens * dim * (3 * dim + dim + 2 * mlp_ratio * dim)
    attention = 2 * 2 * tokens * tokens * dim
    return depth * linear, depth * attention


def model_seconds(products: float, attention: float, precision: str) -> float:
    """A model's time at the peak rates: its ``products`` at ``precision``'s rate (:data:`PRODUCT_RATES`), then its
    ``attention`` at bf16's or float32's (:data:`H100` ``"fp32 attention"``); separate kernels, so the times add."""
    rate = H100["bf16 tensor"] if precision == "bf16" else H100["fp32 attention"]
    return products / H100[PRODUCT_RATES[precision]] + attention / rate


MODEL_BOUND_BY = {"tf32": "tf32 tensor; attention 3xtf32", "ieee": "fp32 cuda cores; attention 3xtf32",
                  "bf16": "bf16 tensor"}  # fmt: skip
"""The "bound by" column of a model's rows."""


def stages(cfg) -> list[tuple[str, float, float, str, float]]:
    """``(stage, FLOPs, bytes, limiting rate, seconds)`` per stage of one iteration."""
    b, s, p, d = cfg.train.batch_size, cfg.data.crop_size, VIT["patch"], VIT["dim"]
    classes = len(cfg.data.classes)
    grid = s // p
    params = 21.7e6 + 2 * d * (classes - 1) + 9 * d * 512 + 9 * 512 * 512 + 512 * classes  # DeiT-S + heads
    blocks, attention = vit_forward_flops(grid * grid + 1, d, VIT["depth"], VIT["mlp_ratio"])
    c = cfg.model.decoder_channels
    decoder = 2 * grid * grid * (9 * d * c + 9 * c * c + c * classes)
    train_products = 3 * b * (blocks + 2 * grid * grid * 3 * p * p * d + decoder)  # forward + backward (2x)
    train_attention = 3 * b * attention
    cam_products = cam_attention = 0.0
    for scale in cfg.cam.scales:
        g = int(scale * s) // p
        blocks, attention = vit_forward_flops(g * g + 1, d, VIT["depth"], VIT["mlp_ratio"])
        cam_products, cam_attention = cam_products + 2 * b * blocks, cam_attention + 2 * b * attention  # and its flip
    train_flops, cam_flops = train_products + train_attention, cam_products + cam_attention
    n = int(s * cfg.loss.reg_scale) ** 2  # energy pixels per image
    pairs = b * n * n
    k2 = 2 * max(16, 2 ** math.ceil(math.log2(classes)))  # the fused kernel's padded, TF32-split classes
    energy_tensor = pairs * 2 * 2 * k2  # two TF32 products per pair
    energy_fp32 = pairs * 16  # 5 differences, 5 FMAs, the TF32 split of W (~6 instructions)
    blocked_bytes = b * (n * n / 2) * 20  # one 8192^2 tile entry: exponent write, exp read+write, 2 matmul reads
    lattice_points = b * n * 6  # loss.reg_kernel=lattice on a GPU: N (d+1) points, d = 5 (codes fixed in advance)
    real_points = lattice_points * LATTICE_REAL_SHARE  # the splat and blur stop at them (Lattice.live)
    # the blur over the real points (6 directions, each read and written), and the build over every fixed point
    lattice_bytes = 6 * real_points * classes * 4 * 2 + lattice_points * LATTICE_BUILD_BYTES
    par_pixels = int(s * cfg.par.scale) ** 2
    par_channels = 2 * 3  # two threshold stacks of background + ~2 classes
    neighbours = PAR_NEIGHBOURS_PER_DILATION * len(cfg.par.dilations)
    par_bytes = cfg.par.num_iter * b * par_pixels * 4 * (2 * par_channels + neighbours)
    par_flops = cfg.par.num_iter * b * par_pixels * neighbours * par_channels * 2
    adam_bytes = params * 4 * 7  # read param, grad, m, v; write param, m, v
    logits_bytes = b * classes * s * s * 4  # the seg logits at the crop's pixels, float32
    seg_bytes = 4 * logits_bytes  # each way written once (resize, CE gradient) and read once (CE, resize gradient)
    seg_flops = 3 * 2 * b * classes * grid * s * (grid + s)  # loss.seg_resize=matmul: its products, forward + backward
    model_rows = [
        ("forward + backward, float32, TF32 (reference)", train_flops, "tf32", train_products, train_attention),
        ("forward + backward, float32, train.fp32_precision=ieee", train_flops, "ieee", train_products,
         train_attention),  # fmt: skip
        ("forward + backward, train.amp (bf16 autocast)", train_flops, "bf16", train_products, train_attention),
        ("CAM pass, float32, TF32 (reference)", cam_flops, "tf32", cam_products, cam_attention),
        ("CAM pass, float32, train.fp32_precision=ieee", cam_flops, "ieee", cam_products, cam_attention),
        ("CAM pass, train.cam_dtype=bfloat16", cam_flops, "bf16", cam_products, cam_attention),
    ]
    rows = [
        *((name, flops, 0.0, MODEL_BOUND_BY[precision], model_seconds(products, attention, precision))
          for name, flops, precision, products, attention in model_rows),  # fmt: skip
        ("PAR pseudo labels (minimal traffic)", par_flops, par_bytes, "hbm", par_bytes / H100["hbm"]),
        (
            "seg CE forward + backward (full-size logits once each way)",
            seg_flops,
            seg_bytes,
            "hbm / fp32 cuda cores",
            max(seg_bytes / H100["hbm"], seg_flops / H100["fp32 cuda cores"]),
        ),
        (
            f"energy, fused kernel ({pairs:.2e} pairs)",
            energy_tensor + energy_fp32,
            0.0,
            "tf32 tensor / fp32 / exp2",
            max(energy_tensor / H100["tf32 tensor"], energy_fp32 / H100["fp32 instructions"], pairs / H100["exp2"]),
        ),
        ("energy, blocked (8192^2 tiles)", energy_tensor / 2, blocked_bytes, "hbm", blocked_bytes / H100["hbm"]),
        (
            f"energy, lattice ({real_points:.1e} real of {lattice_points:.1e} points; blur and build traffic)",
            6 * real_points * classes * 2,
            lattice_bytes,
            "hbm",
            lattice_bytes / H100["hbm"],
        ),
        ("fused AdamW", params * 14, adam_bytes, "hbm", adam_bytes / H100["hbm"]),
    ]
    return rows


def inference_rows(cfg, size: tuple[int, int] = (375, 500)) -> list[tuple[str, float, dict[str, float]]]:
    """``(mode, FLOPs, {precision: seconds})`` of the model alone on one ``size`` image: DeiT-S and the LargeFOV
    decoder at one scale, and at ``infer.scales`` + flip (each scale's input padded to the patch size)."""
    p, d, c = VIT["patch"], VIT["dim"], cfg.model.decoder_channels
    classes = len(cfg.data.classes)

    def forward(scale: float) -> tuple[float, float]:
        gh, gw = (math.ceil(round(n * scale) / p) for n in size)
        tokens = gh * gw
        decoder = 2 * tokens * (9 * d * c + 9 * c * c + c * classes)
        patches = 2 * tokens * 3 * p * p * d
        blocks, attention = vit_forward_flops(tokens + 1, d, VIT["depth"], VIT["mlp_ratio"])
        return blocks + patches + decoder, attention

    precisions = {"float32 (IEEE)": "ieee", "TF32": "tf32", "bf16": "bf16"}
    tta = [forward(k) for k in cfg.infer.scales]  # each with its flip: twice
    tta_sums = (2 * sum(products for products, _ in tta), 2 * sum(attention for _, attention in tta))
    modes = [("single scale", forward(1.0)), (f"scales {cfg.infer.scales} + flip", tta_sums)]
    return [(mode, products + attention, {k: model_seconds(products, attention, v) for k, v in precisions.items()})
            for mode, (products, attention) in modes]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, {"model.pretrained": ""})
    print(f"batch {cfg.train.batch_size}, crop {cfg.data.crop_size}, CAM scales {cfg.cam.scales} + flip, "
          f"PAR {cfg.par.num_iter} iterations at {cfg.par.scale}, energy at {cfg.loss.reg_scale}")  # fmt: skip
    print("| stage | GFLOP | GB | bound by | H100 lower bound, ms |")
    print("|---|---:|---:|---|---:|")
    for name, flops, nbytes, rate, seconds in stages(cfg):
        traffic = f"{nbytes / 1e9:.2f}" if nbytes else "-"
        print(f"| {name} | {flops / 1e9:,.0f} | {traffic} | {rate} | {seconds * 1e3:.2f} |")
    rows = inference_rows(cfg)
    print("\nInference, the model alone on one 500 x 375 image (images/s at most, H100 peak rates):\n")
    print("| mode | GFLOP | " + " | ".join(rows[0][2]) + " |")
    print("|---|---:|" + "---:|" * len(rows[0][2]))
    for mode, flops, seconds in rows:
        print(f"| {mode} | {flops / 1e9:,.0f} | " + " | ".join(f"{1 / t:,.0f}" for t in seconds.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
