"""``train.compile``: the torch.compile'd training forward trains like the eager one."""

from __future__ import annotations

import pytest
from torch._dynamo.utils import counters

from tests.conftest import tiny_config
from wsss.engine.train import train

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_compiled_training_matches_eager(tiny_voc, tmp_path):
    runs = {}
    counters.clear()
    for compiled in (False, True):
        cfg = tiny_config(tiny_voc, max_iters=3, compile=compiled)
        cfg.model.drop_path_rate = 0.0
        runs[compiled] = train(cfg, work_dir=tmp_path / str(compiled), device="cpu")
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo did capture the forward
    eager, compiled = runs[False].history, runs[True].history
    assert [h["step"] for h in compiled] == [1, 2, 3]
    assert {"seg", "reg"} <= set(compiled[-1])  # the dense losses ran through the compiled forward too
    for e, c in zip(eager, compiled, strict=True):
        for k in e:
            assert c[k] == pytest.approx(e[k], rel=1e-4, abs=1e-6), (e["step"], k)
    assert eager[0]["loss"] != eager[-1]["loss"]  # training moved the loss, so the comparison can fail
