"""`firescale report` end to end on the hand-made records: every file, real images, missing and failed rows."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from PIL import Image
from report_records import DATA, RUNS, raw_record

from firescale.cli import main
from firescale.cluster.site import load_site
from firescale.report.build import OUTPUTS
from firescale.report.provenance import git_state


def _report(out, results=RUNS, *extra):
    return main(["report", "local", "--experiment", "digits-lenet", "--results", str(results), "--out", str(out),
                 "--config", str(DATA / "config.yaml"), *extra])


def test_every_output_written_and_real(tmp_path, capsys):
    out = tmp_path / "reports" / "local" / "digits-lenet"
    assert _report(out, RUNS, "--predictions", str(DATA / "predictions.json")) == 0
    printed = capsys.readouterr().out
    assert "g2-b256" in printed and "BELOW BASELINE by 5.0 pts" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # nothing else, no temporaries
    for stem in ("speedup", "accuracy_vs_time", "time_split"):
        with Image.open(out / f"{stem}.png") as image:
            assert image.format == "PNG" and image.size[0] >= 600 and image.size[1] >= 400
            assert len(image.convert("L").getcolors(maxcolors=1 << 16)) > 10  # drawn on, not blank
        assert (out / f"{stem}.pdf").read_bytes().startswith(b"%PDF-")

    md = (out / "report.md").read_text()
    # The config plans two repeats per point; the three without a record render as MISSING rows.
    assert re.search(r"\| g2-b128-r1 \|.*\| MISSING: no run record at .*g2-b128-r1/result.json \|", md)
    assert re.search(r"\| g2-b256-r1 \|.*\| 256 \| 0.2 \| MISSING \|", md)
    assert "| g2-b128-r0 |" in md and "FAILED: ended by walltime 3 times" in md
    assert "| 70.0 ± 14.1 s | 1.46 ± 0.29× |" in md and "| 6.50 ± 0.71 ms | 6.00 ms | −7.7% |" in md
    # Data wait per point, from what each run's trainer recorded (mean wait over mean iteration).
    def wait_share(*points):
        splits = [raw_record(p)["train"]["per_iteration"] for p in points]
        waits = [s["data_wait_s"] for s in splits]
        iterations = [s["data_wait_s"] + s["compute_s"] + s["allreduce_s"] for s in splits]
        return f"{100 * sum(waits) / sum(iterations):.1f}%"
    assert (f"Waiting for data, in percent of each point's mean iteration as its runs recorded it: baseline "
            f"{wait_share('baseline')}, g2-b64 {wait_share('g2-b64-r0', 'g2-b64-r1')}, g2-b256 "
            f"{wait_share('g2-b256-r0')};") in md

    data = json.loads((out / "report.json").read_text())
    prov = data["provenance"]
    assert prov["site"]["sha256"] == load_site("local").digest
    assert prov["dataset_manifest_sha256"] == ["ab" * 32]
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", prov["git"]["commit"])
    assert {r["point"]: r["seed"] for r in prov["runs"]}["g2-b64-r1"] == 2
    assert prov["versions_runs"]["tensorflow"] == ["2.15.1"]
    assert "matplotlib" in prov["versions_report"]
    # the baseline repeats too: its second run has no record
    assert [(f["point"], f["outcome"]) for f in data["failures"]] == [
        ("baseline-r1", "missing"), ("g2-b128-r0", "failed"), ("g2-b128-r1", "missing"), ("g2-b256-r1", "missing")]
    html = (out / "report.html").read_text()
    assert "sha256 " + prov["site"]["sha256"] in html and "report command: firescale report local" in html
    # every figure written, memory.png and accuracy_by_batch.png too, is shown in both, and none that is not
    written = {p.name for p in out.glob("*.png")}
    assert {"memory.png", "accuracy_by_batch.png"} <= written
    assert set(re.findall(r"!\[[^]]*\]\(([\w-]+\.png)\)", md)) == written
    assert set(re.findall(r'<img src="([\w-]+\.png)"', html)) == written


def test_failed_baseline_still_renders(tmp_path):
    results = tmp_path / "runs"
    shutil.copytree(RUNS, results)
    base = raw_record("baseline") | {"outcome": "failed", "reason": "job FAILED with exit code 137", "train": None}
    (results / "baseline" / "result.json").write_text(json.dumps(base))
    out = tmp_path / "out"
    assert _report(out, results) == 0
    md = (out / "report.md").read_text()
    assert ("**The baseline failed: job FAILED with exit code 137. Speedup, scaling efficiency and parity "
            "cannot be computed.**") in md
    assert "| baseline | 1 × " in md and "cannot judge: no baseline" in md
    assert json.loads((out / "report.json").read_text())["speedup_computed"] is False
    with Image.open(out / "speedup.png") as image:
        assert image.format == "PNG"


def test_user_errors(tmp_path, capsys):
    assert main(["report", "local", "--experiment", "nope", "--results", str(RUNS), "--out", str(tmp_path),
                 "--config", str(DATA / "config.yaml")]) == 1
    assert "no experiment 'nope'; known: digits-lenet" in capsys.readouterr().err
    results = tmp_path / "runs"
    shutil.copytree(RUNS, results)
    other = raw_record("g2-b64-r0") | {"site": "titan"}
    (results / "g2-b64-r0" / "result.json").write_text(json.dumps(other))
    assert _report(tmp_path / "out", results) == 1
    assert "key 'site' is 'titan', but this report is for site 'local'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "report.md").exists()


def test_git_state_outside_a_repository(tmp_path):
    assert git_state(tmp_path) == {"repository": str(tmp_path), "commit": "unknown", "dirty": None}


@pytest.mark.parametrize("point", ["baseline", "g2-b64-r0"])
def test_fixture_records_follow_the_trainer_format(point):
    from firescale.results import result_from_dict

    assert result_from_dict(raw_record(point)["train"]).format == "firescale.train.result/1"
