"""A pytest plugin that writes each failure's report to a file as it happens: ``-p tests.failure_log --failure-log
FILE``. pytest (and pytest-xdist's controller) prints tracebacks only at the end of a run, so a run cut by a time
limit, as a lent GPU's call is (bench/gpu_figures.sh), would otherwise keep none of them."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--failure-log", metavar="FILE", help="append each failure's report to FILE as it happens")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("failure_log")
    if path and not hasattr(config, "workerinput"):  # the controller writes: a worker's reports reach it
        config.pluginmanager.register(FailureLog(Path(path)), "failure-log-writer")


class FailureLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            with self.path.open("a") as log:
                log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
