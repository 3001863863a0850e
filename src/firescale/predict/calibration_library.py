"""A site's kept calibrations, one per key: `<results>/<site>/calibrations/<key>.json` as the calibration job wrote
it and `<key>.key.json` beside it (the key's fields, when and by which experiment it was measured); found before a
calibration job is submitted, kept after one measured."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, atomic_write_text, load_json
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.predict.calibrate import load_calibration
from firescale.predict.calibration_key import CalibrationKey

KEPT_FORMAT = "firescale.kept-calibration/1"


@dataclass(frozen=True)
class KeptCalibration:
    """One calibration of the library: its key and fields, when and by which experiment it was measured."""

    key: str
    fields: dict[str, Any]
    measured_at: str          # UTC, ISO 8601: when it was kept, just after its job measured it
    experiment: str           # the experiment whose calibration job measured it
    format: str = KEPT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def library_dir(site: SiteProfile) -> Path:
    """Where the site keeps its calibrations: beside its experiments' folders in its results path."""
    return site.paths.results / site.name / "calibrations"


def calibration_file(folder: Path, key: CalibrationKey) -> Path:
    return folder / f"{key.digest}.json"


def key_file(folder: Path, key: CalibrationKey) -> Path:
    return folder / f"{key.digest}.key.json"


def find_kept(folder: Path, key: CalibrationKey) -> KeptCalibration | None:
    """The kept calibration of `key` in `folder`, checked readable; None when there is none, or when the one under
    its digest was kept for other fields."""
    entry, calibration = key_file(folder, key), calibration_file(folder, key)
    if not entry.is_file() or not calibration.is_file():
        return None
    data = load_json(entry, "kept calibration's key")
    try:
        kept = KeptCalibration(key=str(data["key"]), fields=dict(data["fields"]),
                               measured_at=str(data["measured_at"]), experiment=str(data["experiment"]))
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{entry}: a kept calibration's key needs key, fields, measured_at and experiment; "
                             "remove it, or calibrate again with --recalibrate") from None
    if kept.fields != key.fields:
        return None
    load_calibration(calibration)     # one the predictions can read, or one sentence why not
    return kept


def keep(folder: Path, key: CalibrationKey, calibration: Path, experiment: str) -> KeptCalibration:
    """Keep the calibration at `calibration` (checked readable) under `key`: the calibration first, then its key,
    each written atomically, so that a key in the library always has its calibration beside it."""
    load_calibration(calibration)
    kept = KeptCalibration(key=key.digest, fields=key.fields, experiment=experiment,
                           measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    atomic_write_text(calibration_file(folder, key), calibration.read_text())
    atomic_write_json(key_file(folder, key), kept.to_dict())
    return kept
