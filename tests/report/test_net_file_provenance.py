"""result.json carries the trained net file's path and sha256; the report's provenance shows the runs' hash against
the file read when the report is made, and says when the runs differ."""
from __future__ import annotations

from pathlib import Path

from firescale.report.provenance import collect_provenance, provenance_lines
from firescale.results import result_from_dict

A, B = "a" * 64, "b" * 64
SITE = {"name": "local", "source": "site/local/site.yaml", "sha256": "0" * 64}


def _lines(records: list, now: str | None, tmp_path: Path) -> list[str]:
    net_file = {"path": "/p/mine.prototxt", "sha256": now} if now else None
    prov = collect_provenance(records, site=SITE, repo=tmp_path, command=["firescale", "report"], net_file=net_file)
    return [line for line in provenance_lines(prov) if line.startswith("net file")]


def test_the_runs_net_file_hash_is_read_back_and_shown_against_the_file_now(edited, tmp_path):
    record = edited("baseline", train={"net_file": {"path": "/p/mine.prototxt", "sha256": A}})
    assert record.train is not None and record.train.net_file == {"path": "/p/mine.prototxt", "sha256": A}
    assert result_from_dict(record.train.to_dict()).net_file == record.train.net_file
    assert _lines([record], A, tmp_path) == [
        f"net file: /p/mine.prototxt, sha256 {A} (read when this report was made)",
        f"net file sha256 in the runs: {A} (the same file)"]
    assert _lines([record], B, tmp_path)[1] == f"net file sha256 in the runs: {A} (the file has CHANGED since the runs)"
    other = edited("g2-b64-r0", train={"net_file": {"path": "/p/mine.prototxt", "sha256": B}})
    assert _lines([record, other], A, tmp_path)[1] == f"net file sha256 DIFFERS between runs: {A}, {B}"
    # a built-in net: no net file in the runs, none in the report
    assert _lines([edited("baseline")], None, tmp_path) == []


def test_the_solvers_test_net_file_is_shown_as_the_runs_recorded_it(edited, tmp_path):
    test_net = {"path": "/p/test.prototxt", "sha256": A}
    record = edited("baseline", train={"test_net_file": test_net})
    assert result_from_dict(record.train.to_dict()).test_net_file == test_net

    def lines(records: list) -> list[str]:
        prov = collect_provenance(records, site=SITE, repo=tmp_path, command=["firescale", "report"])
        return [line for line in provenance_lines(prov) if line.startswith("test net file")]

    assert lines([record]) == [f"test net file in the runs: /p/test.prototxt, sha256 {A}"]
    other = edited("g2-b64-r0", train={"test_net_file": {**test_net, "sha256": B}})
    assert lines([record, other]) == [f"test net file DIFFERS between runs: /p/test.prototxt, sha256 {A}; "
                                      f"/p/test.prototxt, sha256 {B}"]
    assert lines([edited("baseline")]) == []      # no test_net in the solver: no line
