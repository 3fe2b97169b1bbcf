from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_config
from tools import ablate
from wsss.analysis.ablation import apply_overrides, format_results, grid, record_results, run_grid, slug
from wsss.config import ConfigError, dump_config


def test_grids_cover_the_paper_table():
    table4 = grid("table4")
    assert len(table4) == 8 and len(grid("variants")) == 5 and len(grid("all")) == 11  # two rows shared
    assert table4["L_cls | vanilla"] == {
        "loss.aux_weight": 0.0, "loss.seg_weight": 0.0, "loss.reg_weight": 0.0, "model.attention.name": "vanilla"
    }  # fmt: skip
    assert table4["+ L_reg | centered"] == {"loss.aux_weight": 1.0, "model.attention.name": "centered"}
    with pytest.raises(ValueError, match="table4"):
        grid("table5")


def test_overrides_are_validated(tiny_voc):
    cfg = tiny_config(tiny_voc)
    out = apply_overrides(cfg, {"model.attention.name": "gfsa", "loss.seg_weight": 0.0})
    assert out.model.attention.name == "gfsa" and out.loss.seg_weight == 0.0
    assert cfg.model.attention.name == "centered"  # the base is untouched
    with pytest.raises(KeyError, match="loss.nope"):
        apply_overrides(cfg, {"loss.nope": 1})
    with pytest.raises(ConfigError, match="loss.seg_weight"):
        apply_overrides(cfg, {"loss.seg_weight": "high"})
    assert slug("+ L_seg | centered") == "L_seg-centered"


def test_run_two_rows_and_resume(tiny_voc, tmp_path, capsys):
    cfg_file = tmp_path / "cfg.py"
    dump_config(tiny_config(tiny_voc, max_iters=3), cfg_file)
    argv = [str(cfg_file), "--grid", "table4", "--rows", "L_cls | centered", "+ L_reg | centered",
            "--out", str(tmp_path / "abl"), "--device", "cpu", "--cosine-images", "2"]  # fmt: skip
    assert ablate.main(argv) == 0
    table = capsys.readouterr().out
    assert "| L_cls | centered |" in table and "| + L_reg | centered |" in table
    results = json.loads((tmp_path / "abl" / "results.json").read_text())
    by_name = {r["name"]: r for r in results}
    assert by_name["L_cls | centered"]["seg_mIoU"] is None and by_name["L_cls | centered"]["aux_cam_mIoU"] is None
    full = by_name["+ L_reg | centered"]
    assert 0 <= full["seg_mIoU"] <= 100 and 0 <= full["cam_mIoU"] <= 100 and -1 <= full["last_cosine"] <= 1
    mtime = (tmp_path / "abl" / "L_reg-centered" / "iter_3.pth").stat().st_mtime_ns
    again = run_grid(tiny_config(tiny_voc, max_iters=3), {"+ L_reg | centered": grid("table4")["+ L_reg | centered"]},
                     tmp_path / "abl", device="cpu", cosine_images=2)  # fmt: skip
    assert (tmp_path / "abl" / "L_reg-centered" / "iter_3.pth").stat().st_mtime_ns == mtime  # not retrained
    assert again[0]["seg_mIoU"] == full["seg_mIoU"]
    assert format_results(again).count("\n") == 3
    # the folder's table still holds the row the second run did not score, in the grid's order
    kept = json.loads((tmp_path / "abl" / "results.json").read_text())
    assert [r["name"] for r in kept] == ["L_cls | centered", "+ L_reg | centered"]
    assert (tmp_path / "abl" / "results.md").read_text() == format_results(kept)


def test_record_results_merges_rows_by_name_in_grid_order(tmp_path):
    def row(name, cam):
        return {"name": name, "cam_mIoU": cam, "aux_cam_mIoU": None, "seg_mIoU": None, "last_cosine": 0.5}

    record_results(tmp_path, [row("+ L_reg | centered", 1.0)])
    record_results(tmp_path, [row("L_cls | vanilla", 2.0), row("+ L_reg | gfsa", 3.0)])  # another process's rows
    merged = record_results(tmp_path, [row("+ L_reg | centered", 4.0)])  # scored again: replaced, not doubled
    assert [(r["name"], r["cam_mIoU"]) for r in merged] == [
        ("L_cls | vanilla", 2.0), ("+ L_reg | centered", 4.0), ("+ L_reg | gfsa", 3.0)
    ]  # fmt: skip
    assert json.loads((tmp_path / "results.json").read_text()) == merged
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="results.json: not an ablation results file"):
        record_results(tmp_path, [row("L_cls | vanilla", 1.0)])
    assert (tmp_path / "results.json").read_text() == "{not json"  # nothing overwritten


def test_cli_config_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("data = dict(crop_size=-64)\n")
    assert ablate.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "data.crop_size" in err
    assert not (tmp_path / "out").exists()
