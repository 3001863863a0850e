"""Reference files: a paper's published result rows (CSV, one row per table row) to show beside measured runs."""
from __future__ import annotations

import csv
import difflib
import io
import math
from dataclasses import dataclass
from pathlib import Path

from firescale.errors import FirescaleError

COLUMNS = ("net", "hardware", "site", "framework", "epochs", "batch", "initial_lr", "train_time_h", "speedup",
           "top1", "top5", "source")
REQUIRED = ("net", "hardware", "train_time_h")
REFERENCE_DIR = Path(__file__).parent / "reference"

# What each number column allows, said in the error when a cell does not fit.
_ALLOWED = {
    "epochs": "a number of epochs above 0, such as 47",
    "batch": "a whole number above 0, such as 256 (empty where the paper gives none, e.g. 'varies')",
    "initial_lr": "a number above 0, such as 0.01",
    "train_time_h": "hours above 0 as a plain decimal, such as 139.2 (days × 24)",
    "speedup": "a number above 0 as printed without the x, such as 13",
    "top1": "a number from 0 to 1, as a fraction, 0.589 for 58.9%",
    "top5": "a number from 0 to 1, as a fraction, 0.887 for 88.7%",
}


@dataclass(frozen=True)
class ReferenceRow:
    """One published row; text cells are '' and number cells None where the paper gives nothing."""

    net: str
    hardware: str
    site: str
    framework: str
    epochs: float | None
    batch: int | None
    initial_lr: float | None
    train_time_h: float
    speedup: float | None
    top1: float | None
    top5: float | None
    source: str

    @property
    def gpus(self) -> int | None:
        """The device count that leads `hardware` ('32 K20' -> 32), None when it does not lead with one."""
        head = self.hardware.split(maxsplit=1)[0] if self.hardware.strip() else ""
        return int(head) if head.isdigit() else None


def shipped_names() -> tuple[str, ...]:
    """The reference files that come with firescale, by name ('firecaffe-table2', ...)."""
    return tuple(sorted(p.stem for p in REFERENCE_DIR.glob("*.csv")))


def shipped_reference(name: str) -> Path:
    """The packaged file for a shipped reference name (with or without '.csv')."""
    stem = name.removesuffix(".csv")
    names = shipped_names()
    if stem not in names:
        near = difflib.get_close_matches(stem, names, n=1)
        hint = f"; did you mean {near[0]!r}" if near else ""
        raise FirescaleError(f"no shipped reference named {name!r}{hint} (shipped: {', '.join(names)})")
    return REFERENCE_DIR / f"{stem}.csv"


def reference_path(value: str | Path) -> Path:
    """A shipped reference name or a path to a reference file, as the file's path."""
    if isinstance(value, str) and value.removesuffix(".csv") in shipped_names():
        return shipped_reference(value)
    path = Path(value).expanduser()
    if not path.exists():
        raise FirescaleError(f"reference {str(value)!r} is neither a shipped reference "
                             f"({', '.join(shipped_names())}) nor an existing file")
    return path


def _header(path: Path, header: list[str]) -> list[str]:
    names = [h.strip() for h in header]
    allowed = f"allowed: {', '.join(COLUMNS)}"
    for name in names:
        if not name:
            raise FirescaleError(f"{path} line 1: an empty column name in the header ({allowed})")
        if name not in COLUMNS:
            near = difflib.get_close_matches(name, COLUMNS, n=1)
            hint = f"; did you mean {near[0]!r}" if near else ""
            raise FirescaleError(f"{path} line 1: unknown column {name!r}{hint} ({allowed})")
        if names.count(name) > 1:
            raise FirescaleError(f"{path} line 1: column {name!r} appears {names.count(name)} times; "
                                 f"each column is named once ({allowed})")
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise FirescaleError(f"{path} line 1: missing required column {missing[0]!r} "
                             f"(required: {', '.join(REQUIRED)}; {allowed})")
    return names


def _number(path: Path, line: int, column: str, cell: str) -> float | None:
    if not cell:
        return None
    where = f"{path} line {line}, column {column!r}: {cell!r}"
    if column == "batch":
        try:
            whole = int(cell)
        except ValueError:
            raise FirescaleError(f"{where} is not a whole number (allowed: {_ALLOWED[column]})") from None
        if whole <= 0:
            raise FirescaleError(f"{where} is not above 0 (allowed: {_ALLOWED[column]})")
        return whole
    try:
        value = float(cell)
    except ValueError:
        raise FirescaleError(f"{where} is not a number (allowed: {_ALLOWED[column]})") from None
    if not math.isfinite(value):
        raise FirescaleError(f"{where} is not a finite number (allowed: {_ALLOWED[column]})")
    if column in ("top1", "top5"):
        if not 0.0 <= value <= 1.0:
            raise FirescaleError(f"{where} is outside 0..1 (give it as a fraction, 0.589 for 58.9%)")
    elif value <= 0.0:
        raise FirescaleError(f"{where} is not above 0 (allowed: {_ALLOWED[column]})")
    return value


def _row(path: Path, line: int, cells: dict[str, str]) -> ReferenceRow:
    for column in REQUIRED:
        if not cells.get(column):
            raise FirescaleError(f"{path} line {line}, column {column!r}: the cell is empty, but "
                                 f"{', '.join(REQUIRED)} are required in every row")
    numbers = {c: _number(path, line, c, cells.get(c, "")) for c in _ALLOWED}
    batch = numbers["batch"]
    train_time_h = numbers["train_time_h"]
    assert train_time_h is not None  # required and non-empty, checked above
    return ReferenceRow(
        net=cells["net"], hardware=cells["hardware"], site=cells.get("site", ""),
        framework=cells.get("framework", ""), epochs=numbers["epochs"],
        batch=None if batch is None else int(batch), initial_lr=numbers["initial_lr"],
        train_time_h=train_time_h, speedup=numbers["speedup"], top1=numbers["top1"], top5=numbers["top5"],
        source=cells.get("source", ""))


def read_reference(path: str | Path) -> list[ReferenceRow]:
    """The rows of a reference file: a header line naming columns from COLUMNS (REQUIRED among them), then
    one line per published row; cells are stripped of surrounding whitespace, blank lines are skipped."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FirescaleError(f"reference file {path} does not exist (give a file path or a shipped name: "
                             f"{', '.join(shipped_names())})") from None
    except OSError as exc:
        raise FirescaleError(f"cannot read reference file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise FirescaleError(f"{path} line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text "
                             f"(a reference file is CSV in UTF-8)") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    names: list[str] | None = None
    rows: list[ReferenceRow] = []
    try:
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            if names is None:
                names = _header(path, record)
                continue
            line = reader.line_num
            if len(record) != len(names):
                few = "few" if len(record) < len(names) else "many"
                raise FirescaleError(f"{path} line {line}: too {few} cells, {len(record)} where the header "
                                     f"has {len(names)} columns ({', '.join(names)})")
            rows.append(_row(path, line, {n: c.strip() for n, c in zip(names, record, strict=True)}))
    except csv.Error as exc:
        raise FirescaleError(f"{path} line {reader.line_num}: not CSV ({exc})") from None
    if names is None:
        raise FirescaleError(f"{path}: the file is empty; a reference file starts with a header line "
                             f"(required: {', '.join(REQUIRED)}; allowed: {', '.join(COLUMNS)})")
    if not rows:
        raise FirescaleError(f"{path}: a header line but no rows; add one line per published row")
    return rows
