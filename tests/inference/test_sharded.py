"""tools/infer.py under torchrun (2 CPU ranks, gloo): the same outputs as one process, an empty share, a killed rank
and a re-run with another number of ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import assert_same_files
from wsss.data.toy.dataset import make_toy_voc
from wsss.utils.distributed import balanced_shards

REPO = Path(__file__).resolve().parents[2]
OPTS = ["--scales", "1.0", "0.75", "--no-flip", "--workers", "0", "--no-progress", "--device", "cpu", "--gallery",
        "--threads", "1"]
"""One torch thread in every process, whatever the machine's cores, so that all round alike: a tool's rank takes its
share of the cores by default, whatever torchrun's ``OMP_NUM_THREADS=1`` says (8 threads for each of 2 ranks on a
16-core GPU machine, where the 2-rank run differed from the 1-thread one, 2026-11-28)."""


def torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    """``ranks`` CPU processes under torchrun on a free port (``--standalone``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def outputs(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes by relative path, with the run's timings taken out of summary.json."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    summary = json.loads(files.pop("summary.json"))
    for key in ("seconds", "images_per_s", "output"):
        summary.pop(key)
    files["summary.json"] = json.dumps(summary, sort_keys=True).encode()
    files.pop("run.json")
    return files


def test_shards_are_balanced_by_pixels_and_deterministic():
    assert balanced_shards([100, 1, 1, 1, 50, 50], 2) == [[0, 1, 3], [2, 4, 5]]  # 100 + 1 + 1 against 50 + 50 + 1
    assert balanced_shards([4, 4, 4, 4], 3) == [[0, 3], [1], [2]]
    assert balanced_shards([7], 3) == [[0], [], []]  # empty shares
    weights = [(i * 7919) % 101 for i in range(1000)]
    shards = balanced_shards(weights, 4)
    assert sorted(i for s in shards for i in s) == list(range(1000))
    loads = [sum(weights[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(weights)


@pytest.fixture(scope="module")
def photos(toy_checkpoint, tmp_path_factory):
    """A folder of 5 images of three sizes (toy scenes, some resized), and the 1-process outputs."""
    from PIL import Image

    root, ckpt = toy_checkpoint
    base = tmp_path_factory.mktemp("sharded")
    inp = base / "in"
    (inp / "sub").mkdir(parents=True)
    extra = make_toy_voc(base / "extra", num_train=2, num_val=1)
    images = sorted((extra / "JPEGImages").glob("*.jpg")) + sorted((root / "JPEGImages").glob("val_*.jpg"))
    assert len(images) == 5
    for i, path in enumerate(images):
        im = Image.open(path)
        if i % 2:
            im = im.resize((im.width * 3 // 2, im.height))
        im.save(inp / ("sub" if i % 3 == 0 else ".") / f"p{i}.png")
    single = base / "single"
    proc = subprocess.run([sys.executable, "tools/infer.py", str(ckpt), str(inp), str(single), *OPTS], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip (one thread, as each rank: the same float rounding)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ckpt, inp, outputs(single)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 7], ids=["2-ranks", "7-ranks-2-empty"])
def test_sharded_inference_equals_one_process(photos, tmp_path, ranks):
    """Masks, labels, image_labels.json, summary.json and the gallery of N ranks equal the 1-process run's; with more
    ranks than images the empty shares do not hang the barrier."""
    ckpt, inp, expected = photos
    out = tmp_path / "out"
    proc = torchrun(ranks, "tools/infer.py", str(ckpt), str(inp), str(out), *OPTS, "--launcher", "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_files(outputs(out), expected)
    assert proc.stdout.count("done 5 images") == 1  # rank 0 prints the merged summary, the others nothing


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_and_a_rerun_with_other_ranks_completes(photos, tmp_path):
    """Rank 1 dies after its first mask: torchrun ends the job (non-zero); a re-run on 3 ranks skips the finished
    images and the outputs equal the 1-process run's."""
    ckpt, inp, expected = photos
    out = tmp_path / "out"
    dying = tmp_path / "dying_infer.py"
    dying.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from wsss.inference.folder import loop
        from tools import infer

        real = loop.save_mask
        def save_then_die(*args, **kwargs):
            real(*args, **kwargs)
            if os.environ["RANK"] == "1":
                os._exit(9)
        loop.save_mask = save_then_die
        raise SystemExit(infer.main(sys.argv[1:]))
    """))
    proc = torchrun(2, str(dying), str(ckpt), str(inp), str(out), *OPTS, "--launcher", "pytorch")
    assert proc.returncode != 0
    masks = sorted(p.name for p in (out / "masks").rglob("*.png"))
    assert 1 <= len(masks) < 5  # one of rank 1's and maybe some of rank 0's
    proc = torchrun(3, "tools/infer.py", str(ckpt), str(inp), str(out), *OPTS, "--launcher", "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["existing"] == len(masks) and summary["done"] == 5 - len(masks)
    got = outputs(out)
    assert {k: v for k, v in got.items() if k != "summary.json"} == {
        k: v for k, v in expected.items() if k != "summary.json"
    }


def test_launcher_pytorch_without_torchrun_is_one_line(photos, tmp_path, capsys):
    from tools import infer as infer_cli

    ckpt, inp, _ = photos
    assert infer_cli.main([str(ckpt), str(inp), str(tmp_path / "o"), *OPTS, "--launcher", "pytorch"]) == 2
    assert "torchrun" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "o", ignore_errors=True)


@pytest.mark.slow
def test_every_rank_works_on_rank_0s_listing(photos, tmp_path):
    """Issue 31, 3: the folder changes while the ranks start (rank 1 would see p0.png renamed to p9.png and a new
    file): rank 1 never lists, so the outputs equal the 1-process run's, and an image that vanished after the
    listing is named as skipped, never counted done."""
    ckpt, inp, expected = photos
    out = tmp_path / "out"
    racing = tmp_path / "racing_infer.py"
    racing.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from wsss.inference.folder import sources
        from tools import infer

        real = sources.scan_folder
        def changed_on_rank_1(root):
            images, skipped = real(root)
            if os.environ["RANK"] == "1":
                images = sorted([i for i in images if i != "sub/p0.png"] + ["p9.png", "new.png"])
            return images, skipped
        sources.scan_folder = changed_on_rank_1
        raise SystemExit(infer.main(sys.argv[1:]))
    """))
    proc = torchrun(2, str(racing), str(ckpt), str(inp), str(out), *OPTS, "--launcher", "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_files(outputs(out), expected)
    assert proc.stdout.count("done 5 images") == 1


def test_an_image_gone_after_the_listing_is_named_as_skipped(photos, tmp_path, monkeypatch):
    from wsss.inference.folder import plan

    ckpt, inp, _ = photos
    moved = tmp_path / "in"
    shutil.copytree(inp, moved)
    real = plan.list_folder

    def renamed_after_listing(*args, **kwargs):
        listed = real(*args, **kwargs)
        (moved / "p1.png").rename(moved / "p1-renamed.png")
        return listed

    monkeypatch.setattr(plan, "list_folder", renamed_after_listing)
    from tools import infer as infer_cli

    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(moved), str(out), *OPTS]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 4 and [s["path"] for s in summary["skipped"]] == ["p1.png"]
    assert len(list((out / "masks").rglob("*.png"))) == 4


LIBRARY_RANK = """
import json, os, sys, time
from pathlib import Path

from wsss.inference.folder.runner import InferenceOptions, run_inference
from wsss.utils.distributed import finish_distributed, init_distributed

info = init_distributed("cpu")
ckpt, inp, out = sys.argv[1:4]
if info.rank == 0:  # rank 0 is slow to put image_labels.json in place: the others must wait for it
    real_replace = os.replace

    def slow_replace(src, dst, *args, **kwargs):
        if os.path.basename(dst) == "image_labels.json":
            time.sleep(2)
        return real_replace(src, dst, *args, **kwargs)

    os.replace = slow_replace
options = InferenceOptions(scales=(1.0,), flip=False, gallery=True, num_workers=0, progress=False)
summary = run_inference(ckpt, inp, out, options=options)
written = {name: (Path(out) / name).is_file() for name in ("image_labels.json", "summary.json", "index.html")}
Path(out, f"returned_{info.rank}.json").write_text(json.dumps({"written": written, "done": summary.done}))
finish_distributed()
"""


@pytest.mark.slow
def test_a_library_caller_on_every_rank_returns_after_rank_0_wrote_the_run_files(photos, tmp_path):
    """run_inference called from Python under torchrun (2 ranks): when it returns on rank 1, rank 0 has written
    image_labels.json, summary.json and index.html, although rank 0 is slow to write them; both return the merged
    summary."""
    ckpt, inp, _ = photos
    script, out = tmp_path / "library_rank.py", tmp_path / "out"
    script.write_text(LIBRARY_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(ckpt), str(inp), str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        returned = json.loads((out / f"returned_{rank}.json").read_text())
        assert returned == {"written": dict.fromkeys(["image_labels.json", "summary.json", "index.html"], True),
                            "done": 5}, rank  # fmt: skip
