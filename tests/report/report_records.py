"""Where the hand-made run records of the report tests live, and reading one as a dict."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
RUNS = DATA / "runs"


def raw_record(point: str) -> dict[str, Any]:
    return json.loads((RUNS / point / "result.json").read_text())
