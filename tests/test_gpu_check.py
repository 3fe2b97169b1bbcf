"""make gpu-check without a GPU: the one-line refusal, the report writer, and the device checks' comparison logic
run on the emulated CUDA device of tests/fake_cuda.py (the Triton kernel replaced by the blocked filter, which
is what the fused one is compared with on a GPU)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tests.fake_cuda import REAL_GPU, fake_cuda, needs_fake_cuda
from tools import gpu_check as gpu_check_cli
from wsss import energy_kernel, gpu_check, losses
from wsss.config import GpuCheckConfig
from wsss.evaluation import metrics
from wsss.par import PAR

TF32_CHECK = "train/infer.fp32_precision: a tf32 product's error over an ieee one's"
EMULATOR_FAILS = [] if REAL_GPU else [TF32_CHECK]
"""The emulated device computes on the CPU, in IEEE float32 whatever the TF32 flags say: that check fails there."""

pytestmark = pytest.mark.usefixtures("one_thread")


def test_without_cuda_it_stops_at_once_with_one_error_line(capsys, tmp_path):
    assert gpu_check_cli.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: no CUDA device is visible")
    assert not list(tmp_path.iterdir())


def test_comparison_helpers():
    want = torch.tensor([3.0, 4.0])
    assert gpu_check.relative_difference(want + torch.tensor([0.0, 0.5]), want) == pytest.approx(0.1)
    assert gpu_check.relative_difference(torch.zeros(2), torch.zeros(2)) == 0.0
    a = np.zeros((10, 100), dtype=np.uint8)
    b = a.copy()
    b[0, :3] = 1
    assert gpu_check.equal_fraction(a, b) == pytest.approx(0.997)
    with pytest.raises(ValueError, match="different shapes"):
        gpu_check.equal_fraction(a, b.T)
    assert gpu_check.Check("x", 1e-3, 1e-3).passed and not gpu_check.Check("x", 2e-3, 1e-3).passed
    assert not gpu_check.Check("x", float("nan"), 1.0).passed
    assert gpu_check.Check("x", 0.9995, 0.999, at_least=True).passed
    assert not gpu_check.Check("x", 0.998, 0.999, at_least=True).passed


def test_report_is_markdown_and_json_with_every_figure(tmp_path):
    report = gpu_check.Report(
        environment={"device": "NVIDIA H100 80GB HBM3", "driver": "580.1", "torch": "2.15.0", "triton": "3.9.0"},
        checks=[gpu_check.Check("fused = blocked", 2.5e-7, 1e-3), gpu_check.Check("masks equal", 0.998, 0.999, True)],
        sections={"bench": "| stage | ms |\n|---|---:|\n| one training iteration | 45.1 |"},
    )
    md, js = gpu_check.write_report(report, tmp_path / "out")
    data = json.loads(js.read_text())
    assert data["passed"] is False and data["environment"]["device"] == "NVIDIA H100 80GB HBM3"
    assert [c["passed"] for c in data["checks"]] == [True, False]
    assert data["checks"][0]["value"] == 2.5e-7
    text = md.read_text()
    assert "| device | NVIDIA H100 80GB HBM3 |" in text and "**FAILED**" in text
    assert "| fused = blocked | 2.5e-07 | <= 0.001 | pass |" in text
    assert "| masks equal | 0.998 | >= 0.999 | FAIL |" in text
    assert "| one training iteration | 45.1 |" in text
    assert not list((tmp_path / "out").glob("*.tmp*"))


def small_gpu_check_config(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg.data.classes = ["background", "cat", "dog"]
    cfg.model.drop_path_rate = 0.0
    cfg.loss.reg_kernel = "auto"  # the step's energy: the lattice cannot run on the emulated device (crf_checks)
    gc = GpuCheckConfig(crop_size=32, energy_side=12, image_size=(24, 40))
    return dataclasses.replace(cfg, gpu_check=gc), gc


def torch_path(monkeypatch) -> None:
    """PAR's Triton kernels replaced by its PyTorch path: Triton cannot run on the emulated device's tensors."""
    monkeypatch.setattr(PAR, "fused_for", lambda self, x: False)


@needs_fake_cuda
def test_device_checks_pass_on_the_emulated_device(tmp_path, monkeypatch):
    cfg, gc = small_gpu_check_config(tmp_path)
    monkeypatch.setattr(energy_kernel, "gaussian_filter_fused", losses.gaussian_filter_dense)
    torch_path(monkeypatch)
    with fake_cuda():
        checks = gpu_check.device_checks(cfg, gc)
    names = [c.name for c in checks]
    assert any("timm" in n for n in names) and any("Segmenter" in n for n in names)
    assert sum(n.startswith("loss term") for n in names) == 4  # cls, aux, seg, reg
    assert sum("brute force" in n for n in names) == 2 * len(gc.energy_points)
    assert "PAR: fused kernels = PyTorch (relative)" in names
    assert [c.name for c in checks if not c.passed] == EMULATOR_FAILS



@needs_fake_cuda
def test_device_checks_fail_when_cuda_counts_differ(tmp_path, monkeypatch):
    """The evaluator's torch path (CUDA) off by one class: the check reports it."""
    cfg, gc = small_gpu_check_config(tmp_path)
    monkeypatch.setattr(energy_kernel, "gaussian_filter_fused", losses.gaussian_filter_dense)
    torch_path(monkeypatch)
    original = metrics._count_torch

    def off_by_one(pred, gt, *args):
        return original((pred + 1).clamp(max=args[0] - 1), gt, *args)

    monkeypatch.setattr(metrics, "_count_torch", off_by_one)
    with fake_cuda():
        checks = gpu_check.device_checks(cfg, gc)
    assert [c.name for c in checks if not c.passed] == ["evaluator: CUDA counts = CPU counts (entries that differ)",
                                                        *EMULATOR_FAILS]  # fmt: skip
