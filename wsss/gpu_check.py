"""``make gpu-check``: what only a real GPU can show, in one command and one report.

1. Device checks, each a figure against its threshold (``GpuCheckConfig``): timm's own ViT = the ``vanilla``
   variant on CUDA; the step's loss terms on CUDA = on the CPU (same weights and batch); the fused Triton energy
   kernel = the blocked version = brute force; PAR's Triton kernels = its PyTorch path on CUDA; the evaluator's
   counts on CUDA = on the CPU, exactly; the ``Segmenter``'s masks on CUDA = on the CPU; the torch dense CRF's
   marginals on CUDA, with PyTorch's sparse products and with its Triton kernels, = on the CPU; the energy loss by
   the permutohedral lattice (``loss.reg_kernel="lattice"``) on CUDA = on the CPU; TF32 engaged where
   ``train.fp32_precision`` / ``infer.fp32_precision`` say ``tf32``.
2. ``bench/bench_train.py --device cuda`` at the paper setting, with the forward and CAM passes in bfloat16
   (``train.amp``, ``train.cam_dtype``) and in the reference's float32;
   ``bench/bench_crf.py --cuda-only``: the dense CRF's ms per image at batch 1 and 16.
3. DDP: a 1-process ``torchrun`` run with NCCL on a generated toy set; its checkpoint at ``resume_from`` resumed to
   ``iters`` equals the uninterrupted run's, bit for bit.
4. ``gpu_check.md`` and ``gpu_check.json``: device, driver, torch, triton, every figure.

Random initialisation at the configured backbone's shape; no pretrained weights, no network. TF32 is off during the
device checks (the Segmenter's included) but the one that engages it, so that CUDA and the CPU compute the same
float32 products.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wsss import energy_kernel
from wsss.config import FP32_PRECISIONS, Config, GpuCheckConfig
from wsss.data.transforms import backbone_mean_std
from wsss.engine.step import TrainingStep
from wsss.evaluation.metrics import ConfusionMatrix
from wsss.inference.crf import dense_crf_batch
from wsss.inference.predictor import Segmenter
from wsss.losses import DenseEnergyLoss, gaussian_filter_dense
from wsss.model_file import load_checkpoint
from wsss.models import build_backbone, build_model
from wsss.models.backbone import create_vit
from wsss.par import PAR
from wsss.utils.fileio import atomic_write_text
from wsss.utils.tensors import fp32_precision

REPO = Path(__file__).resolve().parents[1]


class NoCudaError(RuntimeError):
    """No CUDA device is visible to this process."""


@dataclass
class Check:
    """One comparison: ``value`` against ``limit`` (``value <= limit`` passes; with ``at_least``, ``>=``)."""

    name: str
    value: float
    limit: float
    at_least: bool = False
    detail: str = ""

    @property
    def passed(self) -> bool:
        ok = self.value >= self.limit if self.at_least else self.value <= self.limit
        return bool(np.isfinite(self.value)) and ok


@dataclass
class Report:
    """Everything ``make gpu-check`` measured."""

    environment: dict[str, str]
    checks: list[Check] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)
    """Title -> verbatim output (the benchmark tables, the DDP run)."""
    failures: list[str] = field(default_factory=list)
    """Parts that did not run to the end, with their error."""

    @property
    def passed(self) -> bool:
        return not self.failures and all(c.passed for c in self.checks)


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` over the whole tensor (float64, on the CPU); 0 when both are zero."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    norm = float(want.norm())
    diff = float((got - want).norm())
    return diff / norm if norm > 0 else diff


def equal_fraction(got: np.ndarray | torch.Tensor, want: np.ndarray | torch.Tensor) -> float:
    """Fraction of equal elements of two same-shape label maps."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise ValueError(f"label maps of different shapes: {got.shape} and {want.shape}")
    return float((got == want).mean()) if got.size else 1.0


def environment() -> dict[str, str]:
    """Device name, driver, CUDA runtime, torch, triton, Python."""
    import triton

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=30, check=True,
        ).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown (nvidia-smi not found)"
    return {
        "device": f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})",
        "driver": driver,
        "cuda runtime": str(torch.version.cuda),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def format_markdown(report: Report) -> str:
    """The report as markdown, ready to paste into docs/benchmarks.md."""
    lines = ["# make gpu-check", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report.environment.items()]
    lines += ["", f"**{'all checks passed' if report.passed else 'FAILED'}**", ""]
    lines += ["| check | value | limit | result |", "|---|---:|---:|---|"]
    for c in report.checks:
        limit = f"{'>=' if c.at_least else '<='} {c.limit:.3g}"
        detail = f" ({c.detail})" if c.detail else ""
        lines.append(f"| {c.name}{detail} | {c.value:.3g} | {limit} | {'pass' if c.passed else 'FAIL'} |")
    for failure in report.failures:
        lines += ["", f"FAILED to run: {failure}"]
    for title, text in report.sections.items():
        lines += ["", f"## {title}", "", text.strip()]
    return "\n".join(lines) + "\n"


def write_report(report: Report, out_dir: str | Path) -> tuple[Path, Path]:
    """``gpu_check.md`` and ``gpu_check.json`` in ``out_dir``, each written atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "passed": report.passed,
        "environment": report.environment,
        "checks": [{**dataclasses.asdict(c), "passed": c.passed} for c in report.checks],
        "sections": report.sections,
        "failures": report.failures,
    }
    md, js = out / "gpu_check.md", out / "gpu_check.json"
    atomic_write_text(js, json.dumps(data, indent=2) + "\n")
    atomic_write_text(md, format_markdown(report))
    return md, js


def device_checks(cfg: Config, gc: GpuCheckConfig) -> list[Check]:
    """Part 1: CUDA against timm, the CPU and brute force (module docstring)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    checks = []
    name = cfg.model.backbone

    torch.manual_seed(0)
    vit = create_vit(name).eval()
    ours = build_backbone(name, attention="vanilla").eval()
    ours.vit.load_state_dict(vit.state_dict())
    x = torch.randn(2, 3, gc.crop_size, gc.crop_size, generator=g, device="cpu").to(cuda)
    with torch.no_grad():
        want = vit.to(cuda).forward_features(x)
        got = ours.to(cuda).vit.forward_features(x)
    checks.append(Check("vanilla variant = timm's ViT on CUDA (relative)", relative_difference(got, want),
                        gc.tolerance, detail=f"{name}, {gc.crop_size} px"))  # fmt: skip

    mean, std = backbone_mean_std(name)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(cfg.data.classes)).train()
    s, c = gc.crop_size, len(cfg.data.classes)
    label = torch.zeros(2, c - 1)
    label[0, 0] = label[1, -1] = 1.0
    box = torch.tensor([[0, s, 0, s], [s // 8, s, 0, s - s // 5]])  # the second crop padded
    batch = {"image": torch.randn(2, 3, s, s, generator=g), "label": label, "box": box}
    terms = {}
    for device in (cpu, cuda):
        on = {k: v.to(device) for k, v in batch.items()}
        float32 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, amp=False))
        copy = deepcopy(model).to(device)
        with torch.no_grad():
            _, terms[device.type] = TrainingStep(float32, mean, std, device)(copy, copy, on, cfg.loss.seg_start_iter)
    for k in terms["cpu"]:
        diff = relative_difference(terms["cuda"][k], terms["cpu"][k])
        checks.append(Check(f"loss term {k}: CUDA = CPU (relative)", diff, gc.tolerance, detail="float32"))

    spread = torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0], dtype=torch.float64)  # as in tests/test_energy_kernel.py
    for n, k, offset in zip(gc.energy_points, gc.energy_channels, gc.energy_offsets, strict=True):
        features = torch.randn(n, 5, generator=g, dtype=torch.float64) * spread + offset
        values = torch.rand(n, k, generator=g, dtype=torch.float64)
        brute = torch.exp(-0.5 * torch.cdist(features, features).square()) @ values
        fused = energy_kernel.gaussian_filter_fused(features.float().to(cuda), values.float().to(cuda))
        blocked = gaussian_filter_dense(features.float().to(cuda), values.float().to(cuda))
        for kernel, out in (("fused", fused), ("blocked", blocked)):
            checks.append(Check(f"energy filter: {kernel} = brute force (relative)", relative_difference(out, brute),
                                gc.tolerance, detail=f"n {n}, K {k}, offset {offset:g}"))  # fmt: skip
    side = gc.energy_side
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    rgb = torch.rand(side * side, 3, generator=g) * 255
    xy = torch.stack([ys, xs], dim=-1).reshape(-1, 2).float()
    features = torch.cat([rgb / cfg.loss.reg_sigma_rgb, xy / cfg.loss.reg_sigma_xy], dim=1)
    values = torch.rand(side * side, len(cfg.data.classes), generator=g)
    fused = energy_kernel.gaussian_filter_fused(features.to(cuda), values.to(cuda))
    blocked = gaussian_filter_dense(features.to(cuda), values.to(cuda))
    checks.append(Check("energy filter: fused = blocked (relative)", relative_difference(fused, blocked), gc.tolerance,
                        detail=f"{side} x {side} pixels (the half-resolution crop)"))  # fmt: skip
    images = torch.rand(2, 3, side, side, generator=g).to(cuda)
    maps = torch.rand(2, 6, side, side, generator=g).softmax(1).to(cuda)
    refined = [PAR.from_config(dataclasses.replace(cfg.par, kernel=kernel)).to(cuda)(images, maps)
               for kernel in ("torch", "fused")]  # fmt: skip
    checks.append(Check("PAR: fused kernels = PyTorch (relative)", relative_difference(*refined), gc.tolerance,
                        detail=f"2 x 6 maps of {side} x {side} pixels, {cfg.par.num_iter} steps"))  # fmt: skip

    preds = torch.randint(0, c, (4, *gc.image_size), generator=g)
    gts = torch.randint(0, c, (4, *gc.image_size), generator=g)
    gts[:, :20] = cfg.data.ignore_index
    counts = {}
    for device in (cpu, cuda):
        cm = ConfusionMatrix(c, cfg.data.ignore_index, device=device)
        for p, t in zip(preds, gts, strict=True):
            cm.update(p.to(device), t.to(device))
        counts[device.type] = cm.counts.cpu()
    mismatched = float((counts["cuda"] != counts["cpu"]).sum())
    checks.append(Check("evaluator: CUDA counts = CPU counts (entries that differ)", mismatched, 0.0))

    model.eval()
    classes = list(cfg.data.classes)
    images = [np.asarray(torch.randint(0, 256, (gc.image_size[0], gc.image_size[1], 3), generator=g,
                                       dtype=torch.uint8)) for _ in range(2)]  # fmt: skip
    masks = {}
    ieee = dataclasses.replace(cfg.infer, fp32_precision="ieee")  # the CPU's products, as every check here
    for device in (cpu, cuda):
        segmenter = Segmenter(deepcopy(model).to(device), classes, mean, std, ieee)
        masks[device.type] = [segmenter(image).mask for image in images]
    fractions = [equal_fraction(a, b) for a, b in zip(masks["cuda"], masks["cpu"], strict=True)]
    checks.append(Check("Segmenter masks: pixels equal on CUDA and CPU", min(fractions), gc.min_mask_agreement,
                        at_least=True, detail=f"{len(cfg.infer.scales)} scales + flip"))  # fmt: skip

    a, b = (torch.randn(gc.tf32_side, gc.tf32_side, generator=g, dtype=torch.float64) for _ in range(2))
    exact, errors = a @ b, {}
    for mode in FP32_PRECISIONS:
        with fp32_precision(mode):
            product = a.float().to(cuda) @ b.float().to(cuda)
        errors[mode] = relative_difference(product, exact)
    checks.append(Check("train/infer.fp32_precision: a tf32 product's error over an ieee one's", errors["tf32"]
                        / max(errors["ieee"], 1e-30), gc.min_tf32_error_ratio, at_least=True,
                        detail=f"{gc.tf32_side}^2 float32 products against float64"))  # fmt: skip
    return checks


def crf_checks(cfg: Config, gc: GpuCheckConfig) -> list[Check]:
    """Part 1, the permutohedral lattice (which cannot run on the emulated device of tests/fake_cuda.py): the dense
    CRF, the torch backend's marginals on CUDA against the CPU's, with PyTorch's sparse products and with the Triton
    kernels (``infer.crf.kernel``), two random-colour images of ``image_size`` in one batch; and the energy loss by
    the lattice (``loss.reg_kernel="lattice"``), its value and gradient on CUDA (Triton kernels, codes fixed in
    advance) against the CPU's (PyTorch's products, codes read back), two random crops of ``2 energy_side``."""
    g = torch.Generator().manual_seed(0)
    c = len(cfg.data.classes)
    images = [torch.randint(0, 256, (*gc.image_size, 3), generator=g, dtype=torch.uint8).numpy() for _ in range(2)]
    probs = [torch.rand(c, *gc.image_size, generator=g).softmax(0) for _ in images]
    crf_cfg = dataclasses.replace(cfg.infer.crf, backend="torch", kernel="torch")
    cpu = dense_crf_batch(images, probs, crf_cfg)
    checks = []
    for kernel, what in (("torch", "PyTorch's sparse products"), ("fused", "Triton kernels")):
        cuda = dense_crf_batch(images, [p.cuda() for p in probs], dataclasses.replace(crf_cfg, kernel=kernel))
        gap = max(float((a.cpu() - b).abs().max()) for a, b in zip(cuda, cpu, strict=True))
        checks.append(Check(f"dense CRF (torch backend, {what}): CUDA = CPU marginals (max abs)", gap,
                            gc.crf_tolerance, detail=f"{len(images)} images in one batch, {c} classes"))  # fmt: skip

    energy = DenseEnergyLoss.from_config(dataclasses.replace(cfg.loss, reg_kernel="lattice"), cfg.data.ignore_index)
    side = 2 * gc.energy_side
    crops = torch.rand(2, 3, side, side, generator=g) * 255
    probs = torch.rand(2, c, side, side, generator=g).softmax(1)
    results = {}
    for device in ("cpu", "cuda"):
        p = probs.to(device).requires_grad_(True)
        value = energy(crops.to(device), p, None, probs.argmax(1).to(device))
        value.backward()
        results[device] = value.detach(), p.grad
    gap = max(relative_difference(a, b) for a, b in zip(results["cuda"], results["cpu"], strict=True))
    checks.append(Check("energy loss by the lattice: CUDA = CPU, value and gradient (relative)", gap, gc.tolerance,
                        detail=f"2 crops of {side} x {side}, {c} classes"))  # fmt: skip
    return checks


def run_command(args: list[str], timeout: float, cwd: Path = REPO) -> str:
    """Run a command, return its output; raise with the output's tail if it fails."""
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"{' '.join(args[:3])} ... exited {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout


def bench_sections(config: str, gc: GpuCheckConfig) -> dict[str, str]:
    """Part 2: bench/bench_train.py on CUDA, the forward and CAM passes in bfloat16, then the reference's float32."""
    out = {}
    for dtype in ("bfloat16", "float32"):
        args = [sys.executable, "bench/bench_train.py", "--device", "cuda", "--config", config,
                "--cfg-options", f"train.cam_dtype={dtype}", f"train.amp={dtype == 'bfloat16'}"]  # fmt: skip
        out[f"bench/bench_train.py --device cuda, forward and CAM pass {dtype}"] = run_command(args, gc.part_timeout)
    args = [sys.executable, "bench/bench_crf.py", "--cuda-only", "--cuda-batches", "1", "16"]
    out["bench/bench_crf.py --cuda-only (dense CRF, ms/image at batch 1 and 16)"] = run_command(args, gc.part_timeout)
    return out


def ddp_resume_check(gc: GpuCheckConfig, work: Path) -> tuple[Check, str]:
    """Part 3: 1-process torchrun, NCCL, a toy set: ``ddp_resume_from`` resumed to ``ddp_iters`` = uninterrupted."""
    toy = work / "toy"
    run_command([sys.executable, "tools/make_toy_voc.py", str(toy), "--num-train", str(gc.toy_images),
                 "--num-val", "4"], gc.part_timeout)  # fmt: skip
    run_command([sys.executable, "tools/make_cls_labels.py", str(toy), "--classes", str(toy / "classes.txt"),
                 "--mask-dir", "SegmentationClass"], gc.part_timeout)  # fmt: skip
    options = [f"data.root={toy}", f"train.max_iters={gc.ddp_iters}", f"train.ckpt_interval={gc.ddp_resume_from}",
               f"train.val_interval={gc.ddp_iters * 10}", "train.max_keep_ckpts=10", "data.num_workers=2"]  # fmt: skip

    def train(work_dir: Path, resume: bool) -> str:
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port", "29533",
                "tools/train.py", "configs/toy_centered.py", "--launcher", "pytorch", "--device", "cuda",
                "--work-dir", str(work_dir), "--cfg-options", *options]  # fmt: skip
        return run_command(args + (["--resume"] if resume else []), gc.part_timeout)

    whole, part = work / "whole", work / "part"
    log = train(whole, resume=False)
    part.mkdir()
    shutil.copy(whole / f"iter_{gc.ddp_resume_from}.pth", part / f"iter_{gc.ddp_resume_from}.pth")
    log += train(part, resume=True)
    a = load_checkpoint(whole / f"iter_{gc.ddp_iters}.pth")["model"]
    b = load_checkpoint(part / f"iter_{gc.ddp_iters}.pth")["model"]
    differing = sum(not torch.equal(a[k], b[k]) for k in a)
    detail = f"NCCL, iterations {gc.ddp_resume_from} + resume to {gc.ddp_iters} vs {gc.ddp_iters}"
    return Check("DDP resume: weight tensors that differ from uninterrupted", differing, 0.0, detail=detail), log


def gpu_check(config: str, cfg: Config, out_dir: str | Path, parts: tuple[str, ...] = ("device", "bench", "ddp"),
              progress: Callable[[str], None] = print) -> Report:  # fmt: skip
    """Run the parts, write the report, return it.

    Raises:
        NoCudaError: No CUDA device is visible.
        ValueError: ``data.classes`` is a file name, not a list.
    """
    if not torch.cuda.is_available():
        raise NoCudaError("no CUDA device is visible (torch.cuda.is_available() is False); make gpu-check needs a GPU")
    if not isinstance(cfg.data.classes, list):
        raise ValueError(f"{config}: gpu-check needs data.classes as a list of names (the model's size), not a file")
    gc = cfg.gpu_check
    report = Report(environment=environment())
    for part in parts:
        tic = time.perf_counter()
        progress(f"gpu-check: {part} ...")
        try:
            if part == "device":
                with fp32_precision("ieee"):
                    report.checks += [*device_checks(cfg, gc), *crf_checks(cfg, gc)]
            elif part == "bench":
                report.sections.update(bench_sections(config, gc))
            elif part == "ddp":
                with tempfile.TemporaryDirectory() as tmp:
                    check, log = ddp_resume_check(gc, Path(tmp))
                report.checks.append(check)
                report.sections["DDP resume (torchrun, 1 process, NCCL)"] = log[-4000:]
            else:
                raise ValueError(f"unknown part {part!r}; valid: device, bench, ddp")
        except (RuntimeError, subprocess.SubprocessError, OSError) as err:
            report.failures.append(f"{part}: {type(err).__name__}: {err}")
        progress(f"gpu-check: {part} done in {time.perf_counter() - tic:.0f} s")
        write_report(report, out_dir)  # after every part: an interrupted check keeps what it measured
    return report
