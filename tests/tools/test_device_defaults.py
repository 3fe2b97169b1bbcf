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
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)  # no driver here
    devices = []

    def record(*args, device, **kwargs):
        devices.append(str(device))
        raise Called

    # the tools import these once their arguments parse: patched where they are defined
    monkeypatch.setattr(
        "wsss.inference.folder.runner.run_inference",
        lambda ckpt, src, out, split, options, device, *rest: record(device=device),
    )
    monkeypatch.setattr("wsss.evaluation.folders.evaluate_folders", lambda *args, **kwargs: record(**kwargs))
    (tmp_path / "model.pth").write_bytes(b"")  # checked to exist before torch is imported
    with pytest.raises(Called):
        infer_cli.main([str(tmp_path / "model.pth"), str(tmp_path)])
    with pytest.raises(Called):
        eval_cli.main([str(tmp_path), str(tmp_path)])
    assert devices == (["cuda:0", "cuda"] if cuda else ["cpu", "cpu"])  # infer: the rank's GPU (LOCAL_RANK 0)
