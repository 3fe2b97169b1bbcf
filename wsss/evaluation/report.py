"""The paper's tables from the files ``tools/test.py`` and ``tools/eval_cams.py --pseudo`` wrote (``tools/report.py``).

Three tables, as the paper numbers them:

- Table 1: segmentation mIoU per split (val, and test once the VOC server has scored a ``--format-only`` archive);
- Table 2: per-class IoU of every scored segmentation run;
- Table 3: pseudo-label mIoU, every pixel scored and the certain pixels only (with the uncertain share).

Each row of ours comes from one file and carries the protocol that file records
(:class:`wsss.evaluation.protocol.EvalProtocol`); a file without one is left out and named. When the class list is
VOC's, the paper's row and ToCo's published row (:mod:`wsss.evaluation.paper_tables`) stand above ours, and a
difference row follows each of ours; a cell whose number the sources do not write, or that is NaN (a class absent
from the scored images), stays empty.

A result file that is not what its tool writes (not a regular file, not JSON, a JSON list, a score missing or not a
number: :data:`FIELDS`) stops the report in one line naming the file, what is wrong and the tool that rewrites it.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsss.config import fits_float
from wsss.evaluation import paper_tables as paper
from wsss.evaluation.protocol import EvalProtocol
from wsss.utils.fileio import atomic_write_text, regular_file_problem

WRITERS = {"metrics.json": "tools/test.py", "cam_eval.json": "tools/eval_cams.py --pseudo",
           "submission.json": "tools/test.py --format-only"}  # fmt: skip
"""The result files the report reads, each with the tool that writes it."""
RESULT_FILES = tuple(WRITERS)
TEST_SPLIT = "test"
"""The split the VOC server scores (``--test-miou``)."""


def _is_score(value: Any) -> bool:
    """A number a float holds, NaN included; or None, as ``save_metrics_json`` writes NaN."""
    return value is None or fits_float(value)


_MISSING = object()
KINDS: dict[str, Callable[[Any], bool]] = {
    "a number": _is_score,
    "a number or nothing": lambda value: value is _MISSING or _is_score(value),
    "class names -> numbers": lambda value: isinstance(value, dict) and all(map(_is_score, value.values())),
    "text": lambda value: isinstance(value, str),
}
FIELDS = {
    "metrics.json": {"mIoU": "a number", "per_class.IoU": "class names -> numbers"},
    "cam_eval.json": {"pseudo_every_pixel.mIoU": "a number",
                      "pseudo_every_pixel.per_class.IoU": "class names -> numbers",
                      "pseudo_certain_pixels.mIoU": "a number",
                      "pseudo_certain_pixels.ignored_fraction": "a number or nothing"},
    "submission.json": {"archive": "text"},
}  # fmt: skip
"""What the tables read from each result file (dotted keys), and the kind of :data:`KINDS` each must be."""


@dataclass
class Row:
    """One row: ``kind`` is ``paper``, ``toco``, ``ours`` or ``diff``; ``values`` None where the cell is empty."""

    name: str
    kind: str
    values: list[float | None]
    source: str = ""
    protocol: EvalProtocol | None = None


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[Row] = field(default_factory=list)

    def add_ours(self, name: str, values: list[float | None], source: str, protocol: EvalProtocol) -> None:
        """Our row, NaN as an empty cell, then its difference to each published row above it (empty where either
        cell is)."""
        values = [None if v is None or math.isnan(v) else v for v in values]
        self.rows.append(Row(name, "ours", values, source, protocol))
        for ref in [r for r in self.rows if r.kind in ("paper", "toco")]:
            diff = [None if a is None or b is None else a - b for a, b in zip(values, ref.values, strict=True)]
            self.rows.append(Row(f"{name} - {ref.name}", "diff", diff))

    def to_markdown(self) -> str:
        header = "| | " + " | ".join(self.columns) + " |"
        lines = [f"### {self.title}", "", header, "|---" * (len(self.columns) + 1) + "|"]
        for row in self.rows:
            cells = [_cell(v, row.kind) for v in row.values]
            lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"- {row.name}: {row.source}" for row in self.rows if row.kind in ("paper", "toco")]
        lines += [f"- {row.name}: {row.protocol.line()} ({row.source})" for row in self.rows if row.kind == "ours"]
        if not any(row.kind == "ours" for row in self.rows):
            lines.append("- no run of ours: see the notes below")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        rows = [{"name": r.name, "kind": r.kind, "values": r.values, "source": r.source,
                 "protocol": r.protocol.to_dict() if r.protocol else None} for r in self.rows]  # fmt: skip
        return {"title": self.title, "columns": self.columns, "rows": rows}


def _cell(value: float | None, kind: str) -> str:
    if value is None:
        return ""
    return f"{value:+.2f}" if kind == "diff" else f"{value:.1f}" if kind in ("paper", "toco") else f"{value:.2f}"


@dataclass
class Report:
    """The three tables, the class list they are about, and notes (sources, empty cells, files left out)."""

    classes: list[str]
    voc: bool
    tables: list[Table]
    notes: list[str]

    def to_markdown(self) -> str:
        kind = "PASCAL VOC" if self.voc else "not VOC's: no paper row"
        head = f"# Results: {len(self.classes)} classes ({kind})"
        parts = [head, *(t.to_markdown() for t in self.tables)]
        parts.append("### Notes\n\n" + "\n".join(f"- {n}" for n in self.notes) if self.notes else "")
        return "\n\n".join(p for p in parts if p) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"classes": self.classes, "voc": self.voc, "tables": [t.to_dict() for t in self.tables],
                "notes": self.notes}  # fmt: skip


@dataclass
class _Run:
    """One result file with its protocol."""

    name: str
    path: Path
    protocol: EvalProtocol
    data: dict[str, Any]


def find_results(work_dirs: list[Path]) -> list[Path]:
    """The result files in each work dir and its subfolders one level down, sorted.

    Raises:
        FileNotFoundError: A work dir is not a folder.
    """
    found = []
    for folder in work_dirs:
        if not folder.is_dir():
            raise FileNotFoundError(f"work dir not found: {folder} (the --work-dir of tools/test.py and eval_cams.py)")
        for name in RESULT_FILES:
            found += [*folder.glob(name), *folder.glob(f"*/{name}")]
    return sorted(set(found))


def build_report(
    work_dirs: list[str | Path], test_miou: float | None = None, submission: str | Path | None = None
) -> Report:
    """Read every result file under ``work_dirs`` (:func:`find_results`) into the three tables.

    Args:
        work_dirs: Folders of ``tools/test.py`` / ``tools/eval_cams.py`` outputs.
        test_miou: The mIoU the VOC server returned for the ``--format-only`` archive.
        submission: The ``submission.json`` (or its folder) ``test_miou`` belongs to; needed when several exist.

    Raises:
        FileNotFoundError: A work dir is missing.
        OSError: A result file cannot be read (the message names it).
        ValueError: A result file that is not what its tool writes (:func:`read_result`), no result file with a
            protocol, runs of different class lists, or ``test_miou`` without one test-split submission (each one
            line naming the file and what to do).
    """
    paths = find_results([Path(p) for p in work_dirs])
    notes: list[str] = []
    runs = {name: [] for name in RESULT_FILES}
    for path in paths:
        data, tool = read_result(path), WRITERS[path.name]
        if not isinstance(data.get("protocol"), dict):
            notes.append(f"left out {path}: it records no protocol (written by an older version): rerun {tool}")
            continue
        if path.name == "cam_eval.json" and "pseudo_every_pixel" not in data:
            notes.append(f"left out {path}: no pseudo-label scores: rerun {tool}")
            continue
        try:
            protocol = EvalProtocol.from_dict(data["protocol"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}: rerun {tool}") from None
        _check_fields(path, data)
        runs[path.name].append(_Run(path.parent.name, path, protocol, data))
    if not any(runs.values()):
        raise ValueError(
            f"no result with a protocol under {', '.join(map(str, work_dirs))}: run tools/test.py (and "
            "tools/eval_cams.py --pseudo) with --work-dir there first"
        )
    classes = _classes([*runs["metrics.json"], *runs["cam_eval.json"]])
    voc = all(r.protocol.voc for rs in runs.values() for r in rs)
    scores = _test_scores(runs["submission.json"], test_miou, submission)
    notes = [*_sources(voc), *notes]
    tables = [_table1(runs["metrics.json"], runs["submission.json"], scores, voc),
              _table2(runs["metrics.json"], classes, voc), _table3(runs["cam_eval.json"], voc)]  # fmt: skip
    return Report(classes, voc, tables, notes)


def read_result(path: Path) -> dict[str, Any]:
    """The JSON object of a result file.

    Raises:
        OSError: It cannot be examined or read (the message names it).
        ValueError: It is no regular file (a FIFO would block the read), not JSON, nested past Python's recursion
            limit, or not a JSON object; the message names it and the tool that writes it.
    """
    tool = WRITERS[path.name]
    if problem := regular_file_problem(path):
        raise ValueError(f"{path}: {problem}, not the result file {tool} writes: move it away")
    try:
        data = json.loads(path.read_text())
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path} is not JSON ({err}): rerun {tool}, or move it away") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, not the object {tool} writes: rerun it, or move the "
                         "file away")  # fmt: skip
    return data


def _check_fields(path: Path, data: dict[str, Any]) -> None:
    """Raise ValueError, naming ``path``, the key and the tool that writes the file, unless every field the tables
    read (:data:`FIELDS`) is there and of its kind."""
    for key, kind in FIELDS[path.name].items():
        value = data
        for part in key.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if not KINDS[kind](value):
            found = "no" if value is _MISSING else f"{reprlib.repr(value)} as"
            raise ValueError(f"{path}: {found} '{key}', where {WRITERS[path.name]} writes {kind}: rerun it, or move "
                             "the file away")  # fmt: skip


def write_report(report: Report, out: str | Path) -> tuple[Path, Path]:
    """``out/report.md`` and ``out/report.json``, each atomically; their paths.

    Raises:
        OSError: One cannot be written (a full disk, a read-only folder): one line naming it and the fix.
    """
    md, js = Path(out) / "report.md", Path(out) / "report.json"
    for path, text in ((md, report.to_markdown()), (js, json.dumps(report.to_dict(), indent=2) + "\n")):
        try:
            atomic_write_text(path, text)
        except OSError as err:
            raise OSError(f"cannot write {path} ({err.strerror or err}): free space there, or give --out a folder "
                          "you can write to") from None  # fmt: skip
    return md, js


def _classes(runs: list[_Run]) -> list[str]:
    """The class list every scored run shares (the keys of its per-class IoU)."""
    lists = {}
    for run in runs:
        scores = run.data if run.path.name == "metrics.json" else run.data["pseudo_every_pixel"]
        per_class = scores["per_class"]
        lists.setdefault(tuple(per_class["IoU"]), []).append(str(run.path))
    if len(lists) > 1:
        firsts = "; ".join(f"{len(c)} classes in {paths[0]}" for c, paths in lists.items())
        raise ValueError(f"the results hold different class lists ({firsts}): report one dataset's work dir at a time")
    return list(next(iter(lists), ()))


def _test_scores(submissions: list[_Run], test_miou: float | None, chosen: str | Path | None) -> dict[Path, float]:
    """The server's mIoU by submission file: the one submission of the test split (or ``chosen``, which must be
    one), since the VOC server scores only the test split."""
    if test_miou is None:
        return {}
    if not 0 <= test_miou <= 100:
        raise ValueError(f"--test-miou: a percentage in [0, 100], got {test_miou}")
    if chosen is not None:
        chosen = Path(chosen) if Path(chosen).suffix == ".json" else Path(chosen) / "submission.json"
        submissions = [r for r in submissions if r.path.resolve() == chosen.resolve()]
    other = [r for r in submissions if Path(r.protocol.split).stem != TEST_SPLIT]
    tests = [r for r in submissions if r not in other]
    if len(tests) != 1:
        found = ", ".join(str(r.path) for r in tests) or "none"
        others = "".join(f"; {r.path} is of split {r.protocol.split}" for r in other)
        fix = ("give --submission DIR of the one the server scored" if tests else
               f"run tools/test.py --format-only on the {TEST_SPLIT} split first, and upload its archive")  # fmt: skip
        raise ValueError(f"--test-miou needs the submission.json of tools/test.py --format-only on the {TEST_SPLIT} "
                         f"split, found {found}{others}: {fix}")  # fmt: skip
    return {tests[0].path: test_miou}


def _published(table: Table, key: str, values: dict[str, list[float | None]]) -> None:
    table.rows.append(Row("paper", "paper", values["paper"], f"{paper.SOURCE}, {key}, row {paper.PAPER_ROW}"))
    table.rows.append(Row("ToCo", "toco", values["toco"], f"{paper.SOURCE}, {key}, row {paper.TOCO_ROW}"))


def _split_column(protocol: EvalProtocol) -> str:
    name = Path(protocol.split).stem
    return "val" if name == Path(protocol.val_split).stem else name


def _table1(scored: list[_Run], submissions: list[_Run], scores: dict[Path, float], voc: bool) -> Table:
    columns = ["val", "test"]
    columns += sorted({_split_column(r.protocol) for r in [*scored, *submissions]} - set(columns))
    table = Table("Table 1: segmentation mIoU", columns)
    if voc:
        _published(table, "Table 1", {k: [paper.TABLE1[k]["val"], paper.TABLE1[k]["test"]] + [None] * (len(columns) - 2)
                                      for k in ("paper", "toco")})  # fmt: skip
    for run in scored:
        values: list[float | None] = [None] * len(columns)
        values[columns.index(_split_column(run.protocol))] = run.data["mIoU"]
        table.add_ours(run.name, values, str(run.path), run.protocol)
    for run in submissions:
        values = [None] * len(columns)
        values[columns.index(_split_column(run.protocol))] = scores.get(run.path)
        source = f"{run.path}; mIoU from the VOC server (--test-miou)" if run.path in scores else (
            f"{run.path}; not scored yet: upload {run.data['archive']}, then rerun with --test-miou")  # fmt: skip
        table.add_ours(run.name, values, source, run.protocol)
    return table


def _table2(scored: list[_Run], classes: list[str], voc: bool) -> Table:
    names = list(paper.VOC_SHORT_NAMES) if voc else list(classes)
    table = Table("Table 2: per-class IoU", [*names, "mIoU"])
    if voc:
        _published(table, "Table 2 (val)", {k: [*paper.TABLE2[k]["per_class"], paper.TABLE2[k]["mIoU"]]
                                            for k in ("paper", "toco")})  # fmt: skip
    for run in scored:
        iou = run.data["per_class"]["IoU"]
        table.add_ours(run.name, [*(iou[c] for c in classes), run.data["mIoU"]], str(run.path), run.protocol)
    return table


def _table3(cam_runs: list[_Run], voc: bool) -> Table:
    table = Table("Table 3: pseudo labels", ["every pixel mIoU", "certain pixels mIoU", "uncertain %"])
    if voc:
        _published(table, "Table 3", {k: [paper.TABLE3[k]["every_pixel"], paper.TABLE3[k]["certain_pixels"], None]
                                      for k in ("paper", "toco")})  # fmt: skip
    for run in cam_runs:
        certain = run.data["pseudo_certain_pixels"]
        fraction = certain.get("ignored_fraction")
        uncertain = None if fraction is None else 100 * fraction
        table.add_ours(run.name, [run.data["pseudo_every_pixel"]["mIoU"], certain["mIoU"], uncertain],
                       str(run.path), run.protocol)  # fmt: skip
    return table


def _sources(voc: bool) -> list[str]:
    if not voc:
        return ["the class list is not VOC's: the tables hold our runs only (the paper's rows are on VOC)"]
    return [
        f"paper and ToCo rows: copied as written from Tables 1-3 of {paper.SOURCE} into "
        "wsss/evaluation/paper_tables.py (docs/design.md section 5 quotes the same 72.5 / 72.9 / 74.1 and ToCo's "
        "71.1 / 72.2)",
        *paper.NOTES,
        "uncertain %: no published row writes it, so those cells are empty",
    ]
