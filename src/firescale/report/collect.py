"""Read the sweep's run records (RESULTS/<point>/result.json) into checked RunRecord objects."""
from __future__ import annotations

from pathlib import Path

from firescale.errors import FirescaleError
from firescale.sweep.points import SweepPoint
from firescale.sweep.records import POINT_NAME, RUN_FILE, RunRecord, read_run_record


def missing_record(point: SweepPoint, site: str, nodes: int, where: Path) -> RunRecord:
    """A placeholder for a planned point that has no record, so that its row says so."""
    return RunRecord(point=point.name, experiment=point.experiment, site=site, gpus=point.gpus, nodes=nodes,
                     batch=point.batch, lr=point.lr, repeat=point.repeat, baseline=point.baseline,
                     outcome="missing", reason=f"no run record at {where}", source=str(where))


def collect_runs(results: str | Path, experiment: str) -> list[RunRecord]:
    """Every run record under `results` (one folder per point), checked to belong to `experiment`.

    A folder named like a point (baseline, g2-b64-r0) without a result.json is an error; other
    folders (logs, snapshots) are not points and are left alone.
    """
    results = Path(results)
    if not results.is_dir():
        raise FirescaleError(f"results folder {results} does not exist")
    records = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir() and POINT_NAME.fullmatch(p.name)):
        path = folder / RUN_FILE
        if not path.is_file():
            raise FirescaleError(f"{folder}: a sweep point folder without its {RUN_FILE}")
        record = read_run_record(path)
        if record.point != folder.name:
            raise FirescaleError(f"{path}: key 'point' is {record.point!r} but the record sits in "
                                 f"folder {folder.name!r}")
        if record.experiment != experiment:
            raise FirescaleError(f"{path}: key 'experiment' is {record.experiment!r}, not {experiment!r}; "
                                 f"keep one experiment's records per results folder")
        records.append(record)
    if not records:
        raise FirescaleError(f"results folder {results} holds no run records (<point>/{RUN_FILE})")
    return records
