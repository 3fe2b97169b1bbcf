"""What the config tests share: a file writer, the one-line error check, tools/train.py without training."""

from __future__ import annotations

from pathlib import Path

import pytest

from wsss.config import Config


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The configs tools/train.py would train, without training."""
    seen: list[Config] = []
    monkeypatch.setattr("wsss.engine.train.train", lambda cfg, **kwargs: seen.append(cfg) or pytest.fail("trained"))
    return seen


def write_file(path: Path, text: str) -> Path:
    """``text`` written to ``path`` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def one_error_line(capsys: pytest.CaptureFixture) -> str:
    """What the tool wrote to stderr, checked to be one ``error: ...`` line."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err
