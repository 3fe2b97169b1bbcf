"""What every tool does at start-up, before its heavy imports (torch, timm, mmseg): check the files it was given,
and set the CPU threads it computes with. Standard library only, so that a wrong path is refused in milliseconds and
``make gpu-check`` can run :func:`nvidia_driver_error` with the system ``python3`` before the venv exists.

Threads. torch runs every operator with ``torch.get_num_threads()`` OpenMP threads (every core by default), which
wait for each other at the end of each operator. When the cores are shared (other jobs, other ranks, this tool's
own decoding or CRF processes) a waiting thread is often descheduled, and a ViT forward of thousands of small
operators then runs several times slower than on one thread: ``tools/test.py --tta`` on a loaded 2-core machine
ran at 0.17-0.19 img/s on torch's 2 threads and at 0.90-0.95 img/s on one. :func:`default_threads` therefore gives
each rank its share of the CPUs this process may use, less the worker processes the tool starts beside it. The
price is on a quiet machine with few cores, where the second thread is free: 2 threads ran the same test 1.4x faster
on an idle 2-core machine (docs/benchmarks.md); ``--threads`` or the user's ``OMP_NUM_THREADS`` take precedence.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import sys
from ctypes.util import find_library
from pathlib import Path

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")
"""Present wherever the NVIDIA kernel driver is loaded (also inside containers started with GPUs)."""

__all__ = [
    "add_batch_size_argument",
    "add_threads_argument",
    "apply_threads",
    "available_cpus",
    "config_workers",
    "default_threads",
    "input_error",
    "local_ranks",
    "nvidia_driver_error",
    "refuse",
    "user_threads",
]


# ---------------------------------------------------------------------------------------------------------
# Threads


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a cgroup cpuset, ``taskset``, a cluster's allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def local_ranks() -> int:
    """The processes of this job on this machine: ``LOCAL_WORLD_SIZE`` under torchrun, else 1."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE={value!r} is not a positive integer; torchrun sets it, unset it otherwise")
    return int(value)


def default_threads(workers: int = 0) -> int:
    """This rank's torch threads: its share of :func:`available_cpus` among :func:`local_ranks`, less the ``workers``
    processes or threads it starts beside the model (data loader, decoding, CRF), at least 1.

    Args:
        workers: Worker processes or threads of this rank that run while the model computes (each counted as one
            CPU).
    """
    return max(1, available_cpus() // local_ranks() - workers)


def user_threads() -> int | None:
    """The threads the user asked for with ``OMP_NUM_THREADS`` (a positive integer), else None; under torchrun
    (``LOCAL_WORLD_SIZE`` set) not a value of 1, which torchrun sets for every rank whenever the user has not."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value.isdigit() or int(value) < 1 or (int(value) == 1 and "LOCAL_WORLD_SIZE" in os.environ):
        return None
    return int(value)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads N``, the same in every tool (see :func:`apply_threads`)."""
    parser.add_argument(
        "--threads", type=_positive_int, metavar="N",
        help="torch CPU threads of each rank (default: OMP_NUM_THREADS where the user set it, else the CPUs this "
        "process may use / the ranks on this node, less this rank's worker processes, at least 1; OMP_NUM_THREADS "
        "is set to the same for each rank)",
    )  # fmt: skip


def add_batch_size_argument(parser: argparse.ArgumentParser) -> None:
    """``--batch-size N``, the same in every tool that batches same-size images
    (:func:`wsss.inference.folder.batching.default_batch_size` when not given)."""
    parser.add_argument("--batch-size", type=int, help="most same-size images per forward batch (default: "
                        "infer.batch_size on a GPU, infer.cpu_batch_size on the CPU; within infer.batch_pixels)")


def apply_threads(threads: int | None, workers: int = 0) -> int:
    """Set this rank's CPU threads: ``threads`` (``--threads``), else :func:`user_threads`, else
    :func:`default_threads`; returns the number.

    ``OMP_NUM_THREADS`` is set to it too (torch reads it when it is first imported, and processes started later
    inherit it).

    Args:
        threads: ``--threads``; None takes the user's ``OMP_NUM_THREADS`` or the default.
        workers: Worker processes or threads started beside the model (see :func:`default_threads`).
    """
    count = threads or user_threads() or default_threads(workers)
    os.environ["OMP_NUM_THREADS"] = str(count)
    import torch

    torch.set_num_threads(count)
    return count


def threads_beside(workers: int, chosen: int | None) -> None:
    """Set this rank's torch threads once the worker processes it starts are known (a checkpoint's CRF workers are
    known only once it is read): ``chosen`` (the user's ``--threads`` or ``OMP_NUM_THREADS``, already applied) is
    kept, else :func:`default_threads` of ``workers``."""
    if chosen is None:
        import torch

        torch.set_num_threads(default_threads(workers))


def config_workers(cfg, crf: bool = False, device: str | None = None) -> int:
    """The worker processes a config starts beside the model: ``data.num_workers`` loaders, and with ``crf`` the
    ``infer.crf.workers`` processes of the ``pydensecrf`` backend, and of the ``torch`` backend unless ``device`` is
    a GPU (on a GPU it runs in the rank; None counts them: the default device is known only once torch is imported).

    Args:
        cfg: A :class:`wsss.config.Config`.
        crf: The dense CRF runs.
        device: ``--device`` (``cpu``, ``cuda``, ``cuda:N``) or None.
    """
    on_gpu = device is not None and not device.startswith("cpu")
    crf_processes = cfg.infer.crf.workers if crf and (cfg.infer.crf.backend == "pydensecrf" or not on_gpu) else 0
    return cfg.data.num_workers + crf_processes


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a positive integer, got {text!r}")
    return int(text)


# ---------------------------------------------------------------------------------------------------------
# Inputs


def input_error(files: dict[str, str | Path | None], folders: dict[str, str | Path | None] | None = None) -> str | None:
    """The one-line error for the first of ``files`` that is not a file or ``folders`` that is not a folder
    (None: all there), naming it and the fix (close names in its folder, a missing parent folder).

    Args:
        files: What each file is (``config``, ``checkpoint``) -> its path as given; None values are skipped.
        folders: The same for folders.
    """
    wanted = [(what, path, False) for what, path in files.items()]
    wanted += [(what, path, True) for what, path in (folders or {}).items()]
    for what, path, folder in wanted:
        if path is None:
            continue
        path = Path(path)
        if folder and path.is_dir() or not folder and path.is_file():
            continue
        kind = "folder" if folder else "file"
        if path.is_dir():
            inside = sorted(str(p) for p in path.iterdir() if p.is_file())[:3]
            return f"{what} {path} is a folder, not a file: give one of its files" + (
                f", e.g. {' or '.join(inside)}" if inside else " (it holds none)"
            )
        if path.exists():
            return f"{what} {path} is not a {kind}; give the {what} {kind}"
        if not path.parent.is_dir():
            return f"{what} {path} not found: there is no folder {path.parent}"
        names = sorted(p.name for p in path.parent.iterdir())
        close = [str(path.parent / n) for n in difflib.get_close_matches(path.name, names, n=3, cutoff=0.75)]
        hint = f"did you mean {' or '.join(close)}?" if close else f"no {kind} of that name in {path.parent}"
        return f"{what} {path} not found: {hint}"
    return None


def refuse(error: str) -> int:
    """Print ``error: ERROR`` on stderr; the exit status of a refused command line (2)."""
    print(f"error: {error}", file=sys.stderr)
    return 2


def nvidia_driver_error() -> str | None:
    """Why no NVIDIA GPU can be used here, in one line, or None when a driver is visible: the kernel driver's
    :data:`NVIDIA_DRIVER_FILE`, its user-space library (``libcuda``; WSL has only this) or ``nvidia-smi``."""
    if NVIDIA_DRIVER_FILE.exists() or find_library("cuda") or shutil.which("nvidia-smi"):
        return None
    return (
        f"no CUDA device is visible: no NVIDIA driver here (no {NVIDIA_DRIVER_FILE}, no libcuda, no nvidia-smi); "
        "make gpu-check needs a machine with an NVIDIA GPU and its driver"
    )
