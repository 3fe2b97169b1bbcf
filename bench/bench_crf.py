"""Dense CRF: the torch backend against the pydensecrf2 pool, same images, same cores, one process run.

    python bench/bench_crf.py [--images 6] [--cores 2] [--cases voc3 voc21 coco81] [--cuda-batches 1 16]
                              [--cuda-blur-directions 1 2 3]
    python bench/bench_crf.py --launches [--cases ...]
    python bench/bench_crf.py --traffic [--images 5] [--cases ...]

Cases: VOC-sized photographs (500 x 375) with 3 and 21 classes, COCO-sized (640 x 480) with 81, from the
scikit-image photographs (astronaut, chelsea, coffee, rocket, motorcycle) resized, with model-like probabilities
(softmax of smooth random logits). For each case:

- images/s of ``CrfPool`` with ``backend=pydensecrf`` and ``--cores`` worker processes; of pydensecrf inline, in
  this process on one core (its unary, its two lattices and its mean-field, ``_pydensecrf``: no pool, no copy
  between processes, no argmax: the library alone, the per-core peer with ``--cores 1``); and of the torch backend
  on the CPU with ``--cores`` threads, one image per call and all the images in one call;
- peak memory of one image, each backend in a fresh process (peak RSS, VmHWM, above the RSS after imports);
- on CUDA (when available): ms per image at each ``--cuda-batches`` size and the peak CUDA memory of a call (above
  its inputs) against its bound (the largest run's estimate, which ``infer.crf.memory_mib`` holds, plus the
  marginals the call returns), with each of ``--cuda-kernels`` (``infer.crf.kernel``: ``auto``, the simplices found
  by their Triton kernel and PyTorch's sparse products; ``torch``, PyTorch's alone; ``fused``, the Triton kernels, a
  row for each of ``--cuda-blur-directions``: ``infer.crf.blur_directions``) at each of
  ``--cuda-memory-mib`` (``infer.crf.memory_mib``, the budget that splits a batch into runs: larger runs share each
  run's fixed cost among more images), the most images a run holds, and the batch's traffic bound (``--traffic``) in
  ms per image.

``--profile N`` (with the CUDA table): at the largest ``--cuda-batches`` size, with each kernel choice, one call of
each case in two profiles (``torch.profiler``, each after an untimed call): the construction (a call of 0
iterations: the lattices and the kernels' normalisation) and the whole call; the kernels' count and time summed
against the call's wall time (the GPU's busy share: well below 1 where the host's launches and waits hold the
call), and the N longest.

``--launches``: the operations the host dispatches per CRF call, on the CPU (the Triton kernels in Triton's
interpreter, each launch counted as one: :class:`wsss.utils.op_count.OpCounter`): to build the lattices and the
kernels' normalisation (a call of 0 iterations), and per mean-field iteration, with each kernel choice (``auto`` as
on CUDA: the simplices kernel beside PyTorch's products; the Triton kernels blurring 1, 2 and 3 directions per
launch), on a photograph shrunk to 48 x 64 (the counts do not depend on the size); for 3 and 21 classes also three
stacks of them (``crf_labels_stacked``, the pseudo-label export's call).

``--memory``: the most memory one CRF call holds, bytes per pixel, as the allocator counts it (on the CPU:
:func:`wsss.utils.allocations.peak_allocated`), with each kernel choice, on colour noise (the most lattice points an
image can have) and a photograph at ``--memory-size``, against the estimate ``infer.crf.memory_mib`` is held to
(``wsss.inference.crf``); the Triton path as on a GPU, its simplices kernel in Triton's interpreter and its
products' launches skipped (they allocate nothing; 1 iteration: every buffer is made before the first).

``--traffic``: the memory-bandwidth bound of the Triton kernels' mean-field (:func:`iteration_traffic`: every value read
and written once per product) from the lattices the case's photographs really make (their points per pixel, each
built as a call builds them), in bytes per image and ms per image at an H100's HBM rate, against issue 37's goals,
with the bytes the blurs gather from the caches (:func:`blur_gathers`); with 2 and 3 directions per blur launch; and,
as it would be with the lattice values stored in float16 (each product still summing in float32: emulated on
the CPU by rounding each product's output), the same bound and the marginals' and labels' distance from pydensecrf's.

Prints a markdown table (docs/benchmarks.md, "Dense CRF").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from step_on_paper import H100

from wsss.config import CRF_KERNELS, CrfConfig

CASES = {"voc3": ((375, 500), 3), "voc21": ((375, 500), 21), "coco81": ((480, 640), 81)}
HBM = H100["hbm"]
GOALS = {"voc21": 500, "coco81": 150}
"""Issue 37's images/s of the CRF alone on one H100."""
VARIANTS = {"float32": ((), True, 1), "float32, the slices apart (before)": ((), False, 1),
            "float32, 2 directions per blur": ((), True, 2), "float32, 3 directions per blur": ((), True, 3),
            "float16, Gaussian lattice": ((2,), True, 1), "float16, both lattices": ((2, 5), True, 1)}  # fmt: skip
"""``--traffic``'s rows: the lattices (by their feature dimension d) whose values are stored in float16, whether
the two slices share a launch and the directions one blur launch takes (``infer.crf.blur_directions``;
:func:`iteration_traffic`)."""
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle")


def photographs(size: tuple[int, int], count: int) -> list[np.ndarray]:
    import cv2
    import skimage.data as data

    loaders = [getattr(data, name) for name in PHOTOS[:-1]] + [lambda: data.stereo_motorcycle()[0]]
    h, w = size
    return [np.ascontiguousarray(cv2.resize(loaders[i % len(loaders)]()[..., :3], (w, h), interpolation=cv2.INTER_AREA))
            for i in range(count)]  # fmt: skip


def probabilities(size: tuple[int, int], classes: int, seed: int) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, classes, size[0] // 16 + 1, size[1] // 16 + 1, generator=g) * 3
    return F.interpolate(coarse, size=size, mode="bilinear", align_corners=False)[0].softmax(0).numpy()


def case_inputs(name: str, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    size, classes = CASES[name]
    return photographs(size, count), [probabilities(size, classes, seed) for seed in range(count)]


def rate(fn, count: int) -> float:
    tic = time.perf_counter()
    fn()
    return count / (time.perf_counter() - tic)


def peak_memory(name: str, backend: str) -> float:
    """MiB of max RSS above the RSS after imports and inputs, for one image, in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--peak", name, backend], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])["mib"]


def _peak_child(name: str, backend: str) -> None:
    import torch

    from wsss.config import CrfConfig
    from wsss.inference.crf import crf_labels

    torch.set_num_threads(1)
    images, probs = case_inputs(name, 1)
    before = _status_mib("VmRSS")
    crf_labels(images[0], probs[0], CrfConfig(backend=backend))
    print(json.dumps({"mib": _status_mib("VmHWM") - before}))


def _status_mib(key: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process in MiB; unlike ``ru_maxrss``, ``VmHWM`` does not carry
    the peak of the parent the process was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--cuda-batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--cuda-kernels", nargs="+", default=list(CRF_KERNELS), choices=CRF_KERNELS,
                        help="infer.crf.kernel, a row each (auto on CUDA: the simplices kernel and PyTorch's "
                        "products)")  # fmt: skip
    parser.add_argument("--cuda-memory-mib", type=int, nargs="+", default=[CrfConfig.memory_mib],
                        help="infer.crf.memory_mib, a row each")  # fmt: skip
    parser.add_argument("--cuda-blur-directions", type=int, nargs="+", default=[1], choices=[1, 2, 3],
                        help="the fused kernels' infer.crf.blur_directions, a row each")  # fmt: skip
    parser.add_argument("--cuda-only", action="store_true", help="only the CUDA table (make gpu-check)")
    parser.add_argument("--launches", action="store_true", help="only the operations per call, on the CPU")
    parser.add_argument("--memory", action="store_true", help="only the peak bytes per pixel, on the CPU")
    parser.add_argument("--traffic", action="store_true", help="only the memory-bandwidth bound, on the CPU")
    parser.add_argument("--memory-size", type=int, nargs=2, default=(375, 500), metavar=("H", "W"))
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="with the CUDA table: the N longest kernels of the construction and a call")  # fmt: skip
    parser.add_argument("--peak", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak:
        _peak_child(*args.peak)
        return 0
    cfg = CrfConfig()
    if args.launches:
        launch_table(args, cfg)
        return 0
    if args.memory:
        memory_table(args, cfg)
        return 0
    if args.traffic:
        traffic_table(args, cfg)
        return 0
    import torch

    if not args.cuda_only:
        cpu_table(args, cfg)
    if torch.cuda.is_available():
        cuda_table(args, cfg)
    elif args.cuda_only:
        print("error: --cuda-only needs CUDA", file=sys.stderr)
        return 2
    return 0


def cpu_table(args: argparse.Namespace, cfg: CrfConfig) -> None:
    import importlib.util

    import torch

    from wsss.inference.crf import CrfPool, _pydensecrf

    torch.set_num_threads(args.cores)
    have_reference = importlib.util.find_spec("pydensecrf") is not None
    print(f"torch {torch.__version__}, {args.cores} cores, {args.images} images per case")
    print("| case | pydensecrf pool img/s | pydensecrf inline img/s | torch CPU 1/call img/s | torch CPU batch img/s "
          "| torch / pool | torch / inline | peak MiB pydensecrf | peak MiB torch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.cases:
        images, probs = case_inputs(name, args.images)
        pooled, inline, ref_mem = float("nan"), float("nan"), float("nan")
        if have_reference:
            with CrfPool(replace(cfg, backend="pydensecrf", workers=args.cores)) as pool:
                pooled = rate(lambda p=pool, i=images, q=probs: [f.result() for f in p.submit_batch(i, q)], len(images))
            reference = replace(cfg, backend="pydensecrf")
            inline = rate(lambda i=images, q=probs, r=reference: [_pydensecrf(*x, r) for x in zip(i, q, strict=True)],
                          len(images))  # fmt: skip
            ref_mem = peak_memory(name, "pydensecrf")
        with CrfPool(cfg) as pool:
            single = rate(lambda p=pool, i=images, q=probs: [p.submit(*x).result() for x in zip(i, q, strict=True)],
                          len(images))  # fmt: skip
            batch = rate(lambda p=pool, i=images, q=probs: [f.result() for f in p.submit_batch(i, q)], len(images))
        best = max(single, batch)
        print(f"| {name} | {pooled:.2f} | {inline:.2f} | {single:.2f} | {batch:.2f} | {best / pooled:.2f}x | "
              f"{best / inline:.2f}x | {ref_mem:.0f} | {peak_memory(name, 'torch'):.0f} |")  # fmt: skip


def cuda_table(args: argparse.Namespace, cfg: CrfConfig, device: str = "cuda") -> None:
    """The CUDA table (the module docstring), on ``device`` (the CPU runs the same code, for the tests)."""
    import torch
    from _common import synchronize

    from wsss.inference.crf import _runs, dense_crf_batch, estimated_bytes, uses_kernels
    from wsss.utils.allocations import peak_allocated

    device = torch.device(device)
    columns = ("case", "batch", "infer.crf.kernel", "blur directions per launch", "memory_mib", "ms/image", "images/s",
               "peak CUDA MiB", "bound MiB", "images per run", "traffic bound ms/image")  # fmt: skip
    header = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"
    where = f"CUDA: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU (the CUDA table's code)"
    print(f"\n{where}\n{header}")
    runs_of = [(kernel, k) for kernel in args.cuda_kernels
               for k in (args.cuda_blur_directions if kernel == "fused" else [1])]  # fmt: skip
    runs_of = [(kernel, directions, mib) for kernel, directions in runs_of for mib in args.cuda_memory_mib]
    for name in args.cases:
        profiled = []
        # the i-th image is photograph i % 5 (its lattices; the probabilities change none of the traffic)
        sizes = [lattice_sizes(cfg, i, p) for i, p in zip(*case_inputs(name, len(PHOTOS)), strict=True)]
        for batch_size in args.cuda_batches:
            images, probs = case_inputs(name, batch_size)
            tensors = [torch.from_numpy(p).to(device) for p in probs]
            for kernel, directions, mib in runs_of:
                traffic = sum(call_traffic(sizes[k % len(PHOTOS)], CASES[name][1], cfg.iterations,
                                           directions=directions) for k in range(batch_size)) / batch_size  # fmt: skip
                run_cfg = replace(cfg, kernel=kernel, blur_directions=directions, memory_mib=mib)
                dense_crf_batch(images, tensors, run_cfg)  # warm-up
                synchronize(device)
                tic = time.perf_counter()
                for _ in range(3):
                    dense_crf_batch(images, tensors, run_cfg)
                synchronize(device)
                ms = (time.perf_counter() - tic) / 3 / batch_size * 1000
                peak = peak_allocated(lambda c=run_cfg, i=images, t=tensors: dense_crf_batch(i, t, c), device)
                # the budget bounds a run; the call also holds the marginals it returns (4 bytes a pixel and class)
                fused = uses_kernels(run_cfg, device)
                runs = _runs([tuple(t.shape) for t in tensors], run_cfg, fused)
                largest = max(estimated_bytes(sum(tensors[k][0].numel() for k in run), CASES[name][1], fused)
                              for run in runs)  # fmt: skip
                bound = largest + sum(t.numel() * 4 for t in tensors)
                cells = (name, batch_size, kernel, directions if kernel == "fused" else "-", mib, f"{ms:.2f}",
                         f"{1000 / ms:.1f}", f"{peak / 2**20:.0f}", f"{bound / 2**20:.0f}",
                         max(len(run) for run in runs), f"{traffic / HBM * 1000:.2f}")  # fmt: skip
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                if args.profile and batch_size == max(args.cuda_batches):
                    blurs = f", {directions} blur directions per launch" if kernel == "fused" else ""
                    budget = f", memory_mib {mib}" if len(args.cuda_memory_mib) > 1 else ""
                    profiled.append((f"{name}, batch {batch_size}, {kernel}{blurs}{budget}", images, tensors, run_cfg))
        for label, images, tensors, run_cfg in profiled:  # each case's as it ends: a run cut short keeps them
            profile_call(label, images, tensors, run_cfg, args.profile, device)
        if profiled and name != args.cases[-1]:
            print(f"\n{header}")


def profile_call(label: str, images: list, probs: list, cfg: CrfConfig, top: int, device) -> None:
    """``--profile``: the kernels (a CPU's operators) of one ``dense_crf_batch`` call of ``images`` and their
    ``probs`` on ``device``, its construction (0 iterations) and the whole call, each against its wall time (the
    median of 3)."""
    from _common import kernel_times, print_kernels, timed

    from wsss.inference.crf import dense_crf_batch

    for part, part_cfg in (("construction (0 iterations)", replace(cfg, iterations=0)),
                           (f"whole call ({cfg.iterations} iterations)", cfg)):  # fmt: skip

        def call(c=part_cfg):
            return dense_crf_batch(images, probs, c)

        wall, _ = timed(call, 3, device)
        print_kernels(f"{label}: {part}", kernel_times(call, device), top, device.type == "cuda", wall, "its wall")


def iteration_traffic(pixels: int, lattices: list[tuple[int, int]], classes: int, half: tuple[int, ...] = (),
                      paired: bool = True, directions: int = 1) -> int:  # fmt: skip
    """The fewest bytes one mean-field iteration of an image's ``pixels`` moves on the Triton kernels' path
    (:mod:`wsss.inference.crf.kernels`), each value read and written once per product (every gather a cache hit) and
    each index at 4 bytes. Per lattice of ``(M, d)`` in ``lattices`` (its points, its feature dimension): the splat
    reads the (N, C) marginals and its CSR matrix (N (d+1) columns and weights, M + 1 row offsets) and writes the
    (M, C) lattice values; each blur launch (of ``directions`` of the d + 1 directions, the last of fewer) reads them
    and 2 M neighbours per direction and writes them; the slice reads them and its matrix (N (d+1) entries, N + 1
    offsets). The slices read the (N, C) base (the prior, or the message) and write (N, C): once for both lattices
    when ``paired`` (:func:`wsss.inference.crf.permutohedral.filter_pair_fused`), else once each. A lattice value is
    float32, or float16 where its d is in ``half``."""
    n, c = pixels, classes
    traffic = 2 * n * c * 4 * (1 if paired else len(lattices))
    for m, d in lattices:
        blurs = -(-(d + 1) // directions)
        values = n * c * 4 + (2 * blurs + 2) * m * c * (2 if d in half else 4)
        indices = 2 * n * (d + 1) * 8 + (m + 1 + n + 1) * 4 + (d + 1) * 2 * m * 4
        traffic += values + indices
    return traffic


def lattice_sizes(cfg: CrfConfig, image: np.ndarray, probs: np.ndarray) -> list[tuple[int, int, int]]:
    """``(N, M, d)`` of each lattice a CRF call on the image builds (its pixels, lattice points, feature dimension):
    the lattices themselves, built as the call builds them (a call of 0 iterations on the CPU)."""
    import torch

    from wsss.inference import crf

    sizes, build = [], crf.build_lattice

    def recording(features, *args, **kwargs):
        lattice = build(features, *args, **kwargs)
        sizes.append((features.shape[0], lattice.points, features.shape[1]))
        return lattice

    crf.build_lattice = recording
    try:
        crf.dense_crf(image, torch.from_numpy(probs), replace(cfg, iterations=0, kernel="torch"))
    finally:
        crf.build_lattice = build
    return sizes


def call_traffic(sizes: list[tuple[int, int, int]], classes: int, iterations: int, half: tuple[int, ...] = (),
                 paired: bool = True, directions: int = 1) -> int:  # fmt: skip
    """Bytes a CRF call of ``iterations`` moves at best for one image whose lattices have ``sizes``
    (:func:`lattice_sizes`): :func:`iteration_traffic`'s, that many times."""
    lattices = [(m, d) for _, m, d in sizes]
    return iterations * iteration_traffic(sizes[0][0], lattices, classes, half, paired, directions)


def blur_gathers(sizes: list[tuple[int, int, int]], classes: int, iterations: int, directions: int = 1) -> int:
    """Bytes the blur launches of a CRF call gather for one image (:func:`call_traffic`'s ``sizes``): each point's
    value rows read from the caches, 3 per direction in a launch of one, 9 in a launch of two, 27 of three (each
    earlier direction's rows computed again wherever the next reads them), float32."""
    total = 0
    for _, m, d in sizes:
        launches = [min(directions, d + 1 - j) for j in range(0, d + 1, directions)]
        total += sum(3**k for k in launches) * m * classes * 4
    return iterations * total


def half_storage(half: tuple[int, ...]):
    """A :meth:`~wsss.inference.crf.permutohedral.Lattice.filter` (the PyTorch path's) that rounds each product's
    lattice values to float16 in the lattices of feature dimension in ``half``: float16 storage, float32 sums."""
    from wsss.inference.crf.permutohedral import Lattice, workspace_for

    exact = Lattice.filter

    def rounded(self, values, add_to=None, workspace=None):
        if len(self.blur) - 1 not in half:
            return exact(self, values, add_to, workspace)
        if workspace is None:
            workspace = workspace_for([self], values.shape[1], values.dtype, values.device)
        current, spare = workspace[0, : self.points + 1], workspace[1, : self.points + 1]
        current.addmm_(self.splat, values, beta=0).copy_(current.half())
        for blur in self.blur:
            spare.addmm_(blur, current, beta=0).copy_(spare.half())
            current, spare = spare, current
        if add_to is None:
            add_to = values.new_zeros(values.shape)
        return add_to.addmm_(self.slice, current)

    return rounded


def traffic_table(args: argparse.Namespace, cfg: CrfConfig) -> None:
    import importlib.util

    import torch

    from wsss.inference.crf import _pydensecrf, dense_crf
    from wsss.inference.crf.permutohedral import Lattice

    torch.set_num_threads(args.cores)
    have_reference = importlib.util.find_spec("pydensecrf") is not None
    print(f"{args.images} photographs per case, {cfg.iterations} iterations, H100 HBM {HBM / 1e12:.2f} TB/s; the "
          "distance of the marginals (largest) and labels from pydensecrf's, the PyTorch path's products")  # fmt: skip
    print("| case | lattice values | lattice points per pixel (Gaussian, bilateral) | MB per image | bound ms/image "
          "| bound images/s | goal images/s | goal / bound | blur gathers MB per image | marginals off pydensecrf "
          "| labels equal % |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    exact = Lattice.filter
    for name in args.cases:
        images, probs = case_inputs(name, args.images)
        sizes = [lattice_sizes(cfg, i, p) for i, p in zip(images, probs, strict=True)]
        points = [[m / n for n, m, _ in lattices] for lattices in sizes]
        spans = ", ".join(f"{min(col):.2f}-{max(col):.2f}" for col in zip(*points, strict=True))
        references = [_pydensecrf(i, p, cfg) for i, p in zip(images, probs, strict=True)] if have_reference else []
        classes = CASES[name][1]
        for variant, (half, paired, directions) in VARIANTS.items():
            traffic = sum(call_traffic(lattices, classes, cfg.iterations, half, paired, directions)
                          for lattices in sizes) / len(images)  # fmt: skip
            gathers = sum(blur_gathers(lattices, classes, cfg.iterations, directions) for lattices in sizes)
            off, equal = float("nan"), float("nan")
            if references and paired and directions == 1:  # slices apart, more directions a launch: the same sums
                Lattice.filter = half_storage(half)
                try:
                    q = [dense_crf(i, torch.from_numpy(p), replace(cfg, kernel="torch")).numpy()
                         for i, p in zip(images, probs, strict=True)]  # fmt: skip
                finally:
                    Lattice.filter = exact
                off = max(float(np.abs(a - b).max()) for a, b in zip(q, references, strict=True))
                equal = 100 * np.mean([(a.argmax(0) == b.argmax(0)).mean() for a, b in zip(q, references, strict=True)])
            ms = traffic / HBM * 1000
            goal = GOALS.get(name)
            print(f"| {name} | {variant} | {spans} | {traffic / 1e6:.0f} | {ms:.2f} | {1000 / ms:.0f} | "
                  f"{goal or '-'} | {f'{goal * ms / 1000:.2f}' if goal else '-'} | {gathers / len(images) / 1e6:.0f} | "
                  f"{off:.1e} | {equal:.4f} |",
                  flush=True)  # fmt: skip


def launch_counts(cfg: CrfConfig, image: np.ndarray, probs: np.ndarray, iterations: int = 2,
                  as_on_cuda: bool = False) -> tuple[int, float]:  # fmt: skip
    """Operations of one ``dense_crf`` call of 0 iterations, and per iteration (the difference over ``iterations``),
    the Triton kernels' launches counted as one each; (S, C, H, W) ``probs`` are S stacks of one image
    (``crf_labels_stacked``, the pseudo-label export's call). ``as_on_cuda``: the simplices found as on CUDA
    (:func:`wsss.inference.crf.finds_simplices_by_kernel` there, which ``auto`` on the CPU does not)."""
    import torch

    from wsss.inference import crf
    from wsss.inference.crf import crf_labels_stacked, dense_crf, kernels
    from wsss.utils.op_count import OpCounter

    counts = []
    names = kernels.LAUNCHED
    originals = [getattr(kernels, name) for name in names]
    finds = crf.finds_simplices_by_kernel
    for n in (0, iterations):
        counter = OpCounter()
        for name, kernel in zip(names, originals, strict=True):
            setattr(kernels, name, counter.launches(kernel))
        if as_on_cuda:
            crf.finds_simplices_by_kernel = lambda c, device: finds(c, "cuda")
        try:
            with counter:
                call = crf_labels_stacked if probs.ndim == 4 else dense_crf
                call(image, torch.from_numpy(probs), replace(cfg, iterations=n))
        finally:
            for name, kernel in zip(names, originals, strict=True):
                setattr(kernels, name, kernel)
            crf.finds_simplices_by_kernel = finds
        counts.append(sum(counter.counts.values()))
    return counts[0], (counts[1] - counts[0]) / iterations


def launch_table(args: argparse.Namespace, cfg: CrfConfig) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton kernels on CPU tensors: set before their import
    size = (48, 64)
    print("| case | infer.crf.kernel | blur directions per launch | operations to build (0 iterations) | per iteration "
          "| per call of 10 |\n|---|---|---|---:|---:|---:|")  # fmt: skip
    for name in args.cases:
        classes = CASES[name][1]
        image, probs = photographs(size, 1)[0], probabilities(size, classes, 0)
        cases = [(f"{classes} classes", probs)]
        if 3 * classes <= 128:  # the export's three stacks, whose softmax one program takes
            cases.append((f"3 stacks of {classes}", np.stack([probabilities(size, classes, s) for s in range(3)])))
        for label, p in cases:
            for kernel, directions, on_cuda in (("torch", 1, False), ("auto", 1, True), ("fused", 1, False),
                                                ("fused", 2, False), ("fused", 3, False)):  # fmt: skip
                run_cfg = replace(cfg, kernel=kernel, blur_directions=directions)
                build, per_iteration = launch_counts(run_cfg, image, p, as_on_cuda=on_cuda)
                shown = f"{kernel} (as on CUDA: the simplices kernel)" if on_cuda else kernel
                print(f"| {name} ({label}) | {shown} | {directions if kernel == 'fused' else '-'} | {build} | "
                      f"{per_iteration:g} | {build + cfg.iterations * per_iteration:g} |", flush=True)  # fmt: skip


def memory_table(args: argparse.Namespace, cfg: CrfConfig) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the simplices kernel on CPU tensors: set before its import
    import torch

    from wsss.inference.crf import dense_crf, estimated_bytes, kernels
    from wsss.utils.allocations import SkippedLaunches, peak_allocated

    torch.set_num_threads(args.cores)
    kernels._product_kernel = kernels._blur_kernel = SkippedLaunches()  # this process only
    size = tuple(args.memory_size)
    images = {"colour noise": np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8),
              "photograph": photographs(size, 1)[0]}  # fmt: skip
    print(f"{size[1]} x {size[0]} pixels, bytes per pixel")
    print("| image | classes | infer.crf.kernel | peak | estimate | estimate / peak |\n|---|---:|---|---:|---:|---:|")
    for name, image in images.items():
        for classes in (2, 21, 81):
            probs = torch.from_numpy(probabilities(size, classes, 0))
            for kernel in ("torch", "fused"):
                run_cfg = replace(cfg, kernel=kernel, iterations=1)
                peak = peak_allocated(lambda c=run_cfg, p=probs, i=image: dense_crf(i, p, c)) / (size[0] * size[1])
                estimate = estimated_bytes(1, classes, kernel == "fused")
                print(f"| {name} | {classes} | {kernel} | {peak:,.0f} | {estimate:,} | {estimate / peak:.2f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
