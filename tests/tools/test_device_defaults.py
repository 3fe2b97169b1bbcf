"""Inference and evaluation run on the GPU when there is one, without a flag."""

from __future__ import annotations

import pytest
import torch

from tools import eval as eval_cli
from tools import infer as infer_cli


class Called(Exception):
    """Raised by the stand-ins below to stop the tool once the device it chose is known."""


@pytest.mark.parametrize("cuda", [True, False])
def test_infer_and_eval_default_to_cuda_when_available(monkeypatch, tmp_path, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    devices = []

    def record(*args, device, **kwargs):
        devices.append(device)
        raise Called

    monkeypatch.setattr(infer_cli, "run_inference", lambda *args: record(device=args[-1]))
    monkeypatch.setattr(eval_cli, "evaluate_folders", lambda *args, **kwargs: record(**kwargs))
    with pytest.raises(Called):
        infer_cli.main([str(tmp_path / "model.pth"), str(tmp_path)])
    with pytest.raises(Called):
        eval_cli.main([str(tmp_path), str(tmp_path)])
    assert devices == ["cuda" if cuda else "cpu"] * 2
