"""Fixtures for the report tests: the hand-made run records under tests/report/data, loaded or edited."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from report_records import RUNS, raw_record

from firescale.report.collect import collect_runs
from firescale.report.formatting import ReportContext
from firescale.sweep.records import RunRecord, run_record_from_dict


@pytest.fixture
def records() -> list[RunRecord]:
    """The five hand-made records: baseline, g2-b64 r0/r1, g2-b256 (target missed), g2-b128 (failed)."""
    return collect_runs(RUNS, "digits-lenet")


@pytest.fixture
def edited() -> Callable[..., RunRecord]:
    """A fixture record with some of its keys replaced (nested train keys via train=...)."""

    def make(point: str, train: dict[str, Any] | None = None, **keys: Any) -> RunRecord:
        data = copy.deepcopy(raw_record(point))
        data.update(keys)
        if train:
            data["train"].update(train)
        return run_record_from_dict(data, f"edited {point}")

    return make


@pytest.fixture
def ctx() -> ReportContext:
    return ReportContext(experiment="digits-lenet", site="local", device="x86-64 CPU core", net="lenet_same",
                         description="Test & check: 50% of $x_1$ {a} #1 ~ ^ \\ literal")
