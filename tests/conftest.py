"""Shared fixtures: a tiny hand-made VOC-layout dataset whose every value is known."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

# Triton decides when ``@triton.jit`` runs (the first import of wsss.energy_kernel) whether to compile a kernel or
# to run it in its CPU interpreter. Without a GPU, interpret, so that tests/test_energy_kernel.py runs the fused kernel
# on CPU tensors; with a GPU the tests run the compiled kernel. Set before any wsss import, here because conftest is
# imported before every test module (a subprocess per test would pay a torch import each).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from wsss.config import Config, DataConfig, from_dict, to_dict  # noqa: E402
from wsss.data.classes import voc_palette  # noqa: E402
from wsss.data.labels import labels_from_masks, save_labels  # noqa: E402
from wsss.utils.fileio import save_image, save_mask  # noqa: E402

TINY_CLASSES = ["background", "cat", "dog"]


def write_xml(path: Path, filename: str, size: tuple[int, int], objects: list[tuple[str, int]]) -> None:
    """A VOC annotation with ``objects`` as (name, difficult) pairs."""
    objs = "".join(
        f"<object><name>{n}</name><difficult>{d}</difficult>"
        "<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>"
        for n, d in objects
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<annotation><filename>{filename}</filename><size><width>{size[0]}</width>"
        f"<height>{size[1]}</height><depth>3</depth></size>{objs}</annotation>"
    )


def assert_same_files(got: dict[str, bytes], expected: dict[str, bytes]) -> None:
    """Two ``{relative path: bytes}`` maps are equal; else fail naming the paths that differ (pytest's own diff of
    large byte strings runs for many minutes)."""
    differ = sorted(k for k in got.keys() | expected.keys() if got.get(k) != expected.get(k))
    assert not differ, f"{len(differ)} of {len(expected)} files differ (or are missing on one side): {differ[:10]}"


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread: on a shared CPU, oversubscribed OpenMP threads make tiny ops 10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _kept_threads():
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


@pytest.fixture(autouse=True)
def tool_threads_stay_in_their_test():
    """A tool's main() run in-process sets torch's threads and OMP_NUM_THREADS (wsss.utils.startup.apply_threads):
    put both back after each test, so that the next runs with the threads it was given (e.g. ``one_thread``)."""
    yield from _kept_threads()


@pytest.fixture(autouse=True, scope="module")
def tool_threads_stay_in_their_module():
    """The same around a module, for its module-scoped fixtures that run a tool (an ``OMP_NUM_THREADS`` they left
    would be the next module's "user's choice": tests/evaluation/test_sharded_eval.py after
    tests/inference/test_pseudo_export.py wrote other CAM bytes in its one-process run)."""
    yield from _kept_threads()


def tf32_flags() -> tuple[bool, bool]:
    """What a GPU's cuBLAS and cuDNN read: whether float32 products may run on TF32 tensor cores."""
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def model_precision_seen() -> tuple[bool, bool, torch.dtype | None]:
    """What a GPU's kernels of a model follow: :func:`tf32_flags`, and the dtype CUDA autocast casts to (None: off)."""
    return (*tf32_flags(), torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None)


MODEL_PRECISIONS = [("tf32", "float32", "cpu"), ("ieee", "bfloat16", "cpu"), ("tf32", "bfloat16", "cuda"),
                    ("ieee", "float32", "cuda")]  # fmt: skip
"""``(infer.fp32_precision, infer.dtype, device)`` cases: bf16 on a CPU is ignored; "cuda" is the emulated device
(:func:`tests.fake_cuda.fake_cuda`)."""


def expected_precision(mode: str, dtype: str, device: str) -> tuple[bool, bool, torch.dtype | None]:
    """:func:`model_precision_seen` while a model runs as ``infer.fp32_precision=mode``, ``infer.dtype=dtype`` say on
    ``device``."""
    bf16 = dtype == "bfloat16" and device == "cuda"
    return mode == "tf32", mode == "tf32", torch.bfloat16 if bf16 else None


def record_at_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, probe=tf32_flags) -> list:
    """``owner.name`` replaced by itself recording ``probe()`` (:func:`tf32_flags`) at each call; the list it appends
    to."""
    seen, real = [], getattr(owner, name)

    def recorded(*args, **kwargs):
        seen.append(probe())
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return seen


@pytest.fixture
def tiny_voc(tmp_path: Path) -> Path:
    """Four images of different non-square sizes; masks with a cat square, a dog square and 255 borders."""
    root = tmp_path / "VOC"
    rng = np.random.default_rng(0)
    specs = {  # id: (width, height, classes present)
        "a1": (48, 32, [1]),
        "a2": (40, 56, [2]),
        "b1": (64, 40, [1, 2]),
        "b2": (36, 36, []),
    }
    for image_id, (w, h, present) in specs.items():
        image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        mask = np.zeros((h, w), dtype=np.uint8)
        for k, c in enumerate(present):
            y0, x0 = 4 + 6 * k, 4 + 10 * k
            mask[y0 - 1 : y0 + 13, x0 - 1 : x0 + 13] = 255
            mask[y0 : y0 + 12, x0 : x0 + 12] = c
        save_image(root / "JPEGImages" / f"{image_id}.jpg", image)
        save_mask(root / "SegmentationClass" / f"{image_id}.png", mask, voc_palette())
        write_xml(
            root / "Annotations" / f"{image_id}.xml",
            f"{image_id}.jpg",
            (w, h),
            [(TINY_CLASSES[c], int(c == 2)) for c in present],
        )
    sets = root / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("a1\na2\nb1\n")
    (sets / "val.txt").write_text("b1\nb2\n")
    (root / "classes.txt").write_text("\n".join(TINY_CLASSES) + "\n")
    save_labels(root / "cls_labels.json", labels_from_masks(root / "SegmentationClass", 3), TINY_CLASSES)
    return root


def tiny_config(root: Path, **train_kw) -> Config:
    """A 3-block ViT with 8 px patches on 32 px crops: seconds per run on CPU. PAR in PyTorch on every device: the
    emulated CUDA device of tests/fake_cuda.py cannot run Triton kernels (tests/test_par_kernel.py tests them)."""
    return from_dict(
        Config,
        {
            "data": {
                "root": str(root), "classes": "classes.txt", "train_split": "train", "val_split": "val",
                "mask_dir": "SegmentationClass", "crop_size": 32, "num_workers": 0,
            },
            "model": {
                "backbone": "vit_tiny_patch16_224", "pretrained": "", "drop_path_rate": 0.1,
                "backbone_kwargs": {"depth": 3, "embed_dim": 32, "num_heads": 2, "patch_size": 8},
                "decoder_channels": 16, "decoder_dilation": 2, "aux_layer": -2,
            },
            "cam": {"scales": [1.0, 0.5]},
            "par": {"num_iter": 2, "dilations": [1, 2], "kernel": "torch"},
            "loss": {"seg_start_iter": 2},
            "optim": {"lr": 1e-3, "warmup_iters": 2},
            # IEEE products: on a real GPU the tests compare CUDA's results with the CPU's (tests/fake_cuda.py)
            "train": {"max_iters": 6, "batch_size": 2, "ckpt_interval": 3, "val_interval": 100, "log_interval": 1,
                      "fp32_precision": "ieee", **train_kw},
            "infer": {"fp32_precision": "ieee"},
        },
    )  # fmt: skip


@pytest.fixture
def tiny_tagged(tiny_voc: Path, tmp_path: Path) -> Path:
    """The tiny images in nested folders with a hand-written tags.csv and no mask, no split, no class list."""
    root = tmp_path / "photos"
    tags = {"a1": "cat", "a2": "dog", "b1": "cat;dog", "b2": ""}
    rows = ["image,tags"]
    for k in range(3):  # 12 images, so that both hash parts of val_fraction 0.3 hold some
        for image_id, names in tags.items():
            rel = f"set{k}/{'pets/' if k else ''}{image_id}.jpg"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes((tiny_voc / "JPEGImages" / f"{image_id}.jpg").read_bytes())
            rows.append(f"{rel},{names.replace(';', ' ') if k == 1 else names}")
    (root / "tags.csv").write_text("\n".join(rows) + "\n")
    return root


def tiny_tagged_config(root: Path, **train_kw) -> Config:
    """:func:`tiny_config` on the tags layout of :func:`tiny_tagged`."""
    cfg = tiny_config(root, **train_kw)
    cfg.data = from_dict(DataConfig, {
        **to_dict(cfg)["data"], "layout": "tags", "image_dir": ".", "label_file": "tags.csv", "classes": None,
        "train_split": "train", "val_split": "val", "val_fraction": 0.3,
    })  # fmt: skip
    return cfg


def resized_copy(root: Path, folder: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    """A copy of the VOC-layout set ``root`` at ``folder`` whose images ``sizes`` names are resized to (width,
    height), their masks too where they have one (nearest neighbour)."""
    shutil.copytree(root, folder)
    for image_id, size in sizes.items():
        image = folder / "JPEGImages" / f"{image_id}.jpg"
        Image.open(image).resize(size).save(image, quality=95)
        mask = folder / "SegmentationClass" / f"{image_id}.png"
        if mask.is_file():
            Image.open(mask).resize(size, Image.NEAREST).save(mask)
    return folder
