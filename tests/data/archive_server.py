"""Small archives with the internal layout of the real VOC 2012, SBD and COCO 2014 ones, a local HTTP server that
serves them to the data-preparation tests (Range requests; on demand a download cut midway, sent at another pace,
with other headers, or a redirect), and a disk of a chosen free space."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import threading
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.io import savemat

from tests.conftest import write_xml
from wsss.data.classes import VOC_CLASSES, voc_palette
from wsss.data.prepare.download import Archive
from wsss.utils.fileio import save_image, save_mask

VOC_TRAIN, VOC_VAL = ["2007_000032", "2007_000039"], ["2007_000033"]
SBD_TRAIN, SBD_VAL = ["2008_000002", "2007_000032"], ["2008_000003", "2007_000033"]
TRAIN_AUG = sorted((set(SBD_TRAIN) | set(SBD_VAL) | set(VOC_TRAIN)) - set(VOC_VAL))
PRESENT = {"2007_000032": [1, 15], "2007_000039": [20], "2007_000033": [8], "2008_000002": [12], "2008_000003": [3]}
"""Classes (VOC indices) in each image's mask and annotation."""


def _mask(image_id: str, h: int = 24, w: int = 32) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    for k, c in enumerate(PRESENT[image_id]):
        mask[2 + 8 * k : 8 + 8 * k, 3:20] = c
    return mask


def make_voc_archives(folder: Path) -> list[Archive]:
    """``VOCtrainval_11-May-2012.tar`` (``VOCdevkit/VOC2012/...``) and ``benchmark.tgz``
    (``benchmark_RELEASE/dataset/{img,cls,train.txt,val.txt}``) in ``folder``; their :class:`Archive` records."""
    stage = folder / "stage"
    voc = stage / "VOCdevkit" / "VOC2012"
    rng = np.random.default_rng(0)
    for image_id in PRESENT:  # VOC 2012's JPEGImages and Annotations cover SBD's images too
        save_image(voc / "JPEGImages" / f"{image_id}.jpg", rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
        write_xml(voc / "Annotations" / f"{image_id}.xml", f"{image_id}.jpg", (32, 24),
                  [(VOC_CLASSES[c], 0) for c in PRESENT[image_id]])  # fmt: skip
    for image_id in VOC_TRAIN + VOC_VAL:
        save_mask(voc / "SegmentationClass" / f"{image_id}.png", _mask(image_id), voc_palette())
    sets = voc / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    for name, ids in (("train", VOC_TRAIN), ("val", VOC_VAL), ("trainval", VOC_TRAIN + VOC_VAL)):
        (sets / f"{name}.txt").write_text("".join(f"{i}\n" for i in ids))
    sbd = stage / "benchmark_RELEASE" / "dataset"
    for image_id in SBD_TRAIN + SBD_VAL:
        seg = _mask(image_id)
        (sbd / "cls").mkdir(parents=True, exist_ok=True)
        present = np.unique(seg[seg > 0]).astype(np.uint8)
        savemat(str(sbd / "cls" / f"{image_id}.mat"), {"GTcls": {"Segmentation": seg, "CategoriesPresent": present,
                                                                "Boundaries": np.zeros(1, dtype=object)}})  # fmt: skip
        save_image(sbd / "img" / f"{image_id}.jpg", rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    (sbd / "train.txt").write_text("".join(f"{i}\n" for i in SBD_TRAIN))
    (sbd / "val.txt").write_text("".join(f"{i}\n" for i in SBD_VAL))
    with tarfile.open(folder / "VOCtrainval_11-May-2012.tar", "w") as tar:
        tar.add(stage / "VOCdevkit", arcname="VOCdevkit")
    with tarfile.open(folder / "benchmark.tgz", "w:gz") as tar:
        tar.add(stage / "benchmark_RELEASE", arcname="benchmark_RELEASE")
    return [record(folder / "VOCtrainval_11-May-2012.tar"), record(folder / "benchmark.tgz")]


def make_coco_archives(folder: Path) -> list[Archive]:
    """``train2014.zip``, ``val2014.zip`` (``<split>2014/COCO_<split>2014_<id>.jpg``) and
    ``annotations_trainval2014.zip`` (``annotations/instances_<split>2014.json``); their :class:`Archive` records."""
    cats = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}]
    rng = np.random.default_rng(1)
    with zipfile.ZipFile(folder / "annotations_trainval2014.zip", "w") as ann_zip:
        for split in ("train", "val"):
            images, anns = [], []
            with zipfile.ZipFile(folder / f"{split}2014.zip", "w") as zf:
                for image_id in (1, 2, 3):
                    name = f"COCO_{split}2014_{image_id:012d}.jpg"
                    stage = folder / "stage" / name
                    save_image(stage, rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
                    zf.write(stage, f"{split}2014/{name}")
                    images.append({"id": image_id, "file_name": name, "height": 20, "width": 30})
                    polygon = [[2.0, 2.0, 12.0, 2.0, 12.0, 10.0, 2.0, 10.0]]
                    anns.append(
                        {
                            "id": 10 * image_id,
                            "image_id": image_id,
                            "category_id": cats[image_id % 2]["id"],
                            "iscrowd": 0,
                            "segmentation": polygon,
                            "area": 80.0,
                            "bbox": [2, 2, 10, 8],
                        }
                    )
            payload = {"images": images, "annotations": anns, "categories": cats}
            ann_zip.writestr(f"annotations/instances_{split}2014.json", json.dumps(payload))
    return [record(folder / n) for n in ("train2014.zip", "val2014.zip", "annotations_trainval2014.zip")]


def record(path: Path, url: str = "http://127.0.0.1:9/unreachable") -> Archive:
    """The :class:`Archive` of a generated file: its real MD5; an address that must not be needed."""
    return Archive(path.name, f"{url}/{path.name}", md5=hashlib.md5(path.read_bytes()).hexdigest())


def limit_disk(monkeypatch, folder: Path, free: int) -> None:
    """Make every free-space query see a disk with ``free`` bytes free now, less what is written under ``folder``
    from now on."""
    before = _bytes_under(folder)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=free - (_bytes_under(folder) - before)))


def _bytes_under(folder: Path) -> int:
    return sum(os.lstat(os.path.join(top, f)).st_size for top, _, files in os.walk(folder) for f in files)


Sender = Callable[[object, bytes], None]
"""Writes a body to the client's socket file (``wfile``), at its own pace."""


class ArchiveServer:
    """Serves the files of ``folder`` on 127.0.0.1 with Range support; records every request's path and Range
    header; ``cut[name] = n`` makes the next download of ``name`` stop after ``n`` bytes (connection closed);
    ``ranges = False`` makes it answer every request with the whole file, as servers without Range support do;
    ``restart = True`` makes it answer a Range request with a 206 from byte 0; ``headers[name]`` replaces headers of
    ``name``'s answer (None: not sent); ``send[name]`` writes its body; ``redirect[name]`` answers with a 302 there."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.requests: list[tuple[str, str | None]] = []
        self.cut: dict[str, int] = {}
        self.ranges = True
        self.restart = False
        self.headers: dict[str, dict[str, str | None]] = {}
        self.send: dict[str, Sender] = {}
        self.redirect: dict[str, str] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> ArchiveServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                name = self.path.lstrip("/")
                server.requests.append((name, self.headers.get("Range")))
                if name in server.redirect:
                    self.send_response(302)
                    self.send_header("Location", server.redirect[name])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = server.folder / name
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                match = server.ranges and re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                start = int(match.group(1)) if match else 0
                if start >= len(data) and match:
                    self.send_error(416)
                    return
                self.send_response(206 if match else 200)
                start = 0 if server.restart else start
                headers = {"Content-Length": str(len(data) - start)}
                if match:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                for key, value in {**headers, **server.headers.get(name, {})}.items():
                    if value is not None:
                        self.send_header(key, value)
                self.end_headers()
                body = data[start:]
                if name in server.cut:
                    body = body[: server.cut.pop(name)]
                    self.close_connection = True
                try:
                    server.send.get(name, lambda wfile, body: wfile.write(body))(self.wfile, body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up
                    self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        return Handler
