"""`firescale report --store`: the runs go into a real SQLite store, and the report compares them with the last
sweep of another commit or other versions there ("Against the last sweep")."""
from __future__ import annotations

import json
import random
import re

from report_records import DATA, raw_record

from firescale.cli import main
from firescale.store.database import open_store
from firescale.store.select import Selection, select_runs

POINTS = ("baseline", "g2-b64-r0", "g2-b64-r1", "g2-b128-r0", "g2-b256-r0")
TITLE = "Against the last sweep"


def _sweep(folder, rng, *, commit, slower=1.0, versions=None):
    """The hand-made records as a sweep of `commit`: each iteration `slower` times as long, 1% noise."""
    for point in POINTS:
        raw = raw_record(point)
        train = raw["train"]
        if train is not None:
            factor = slower * rng.gauss(1.0, 0.01)
            for key in ("data_wait_s", "compute_s", "allreduce_s"):
                train["per_iteration"][key] *= factor
            train["train_time_s"] *= factor
            for e in train["evals"]:
                e["wall_s"] *= factor
            train["versions"].update(commit=commit, **(versions or {}))
        (folder / point).mkdir(parents=True)
        (folder / point / "result.json").write_text(json.dumps(raw, indent=1))
    return folder


def _report(results, out, store):
    return main(["report", "local", "--experiment", "digits-lenet", "--results", str(results), "--out", str(out),
                 "--config", str(DATA / "config.yaml"), "--store", str(store)])


def test_a_second_sweep_of_other_code_is_reported_against_the_first(tmp_path, capsys):
    rng, store = random.Random(52), tmp_path / "store.sqlite"
    first = _sweep(tmp_path / "first", rng, commit="a" * 40)
    assert _report(first, tmp_path / "out1", store) == 0
    printed = capsys.readouterr().out
    assert f"{store}: 5 runs added, 0 already there; no earlier sweep" in printed
    assert TITLE not in (tmp_path / "out1" / "report.md").read_text()
    assert "against_last_sweep" not in json.loads((tmp_path / "out1" / "report.json").read_text())
    # The same sweep again adds nothing and, being the same code, has nothing to be compared with.
    assert _report(first, tmp_path / "out1", store) == 0
    assert f"{store}: 0 runs added, 5 already there; no earlier sweep" in capsys.readouterr().out

    second = _sweep(tmp_path / "second", rng, commit="b" * 40, slower=1.2, versions={"numpy": "2.0.0"})
    out = tmp_path / "out2"
    assert _report(second, out, store) == 0
    # The failed run has no train record: the same record in both, so stored once.
    assert (f"{store}: 4 runs added, 1 already there; compared with the last sweep before it (commit aaaaaaaaaaaa, "
            f"finished 20") in capsys.readouterr().out
    md = (out / "report.md").read_text()
    section = md.split(f"## {TITLE}\n", 1)[1].split("\n## ", 1)[0]
    assert ("Against the store's last sweep of digits-lenet on local before this one: commit aaaaaaaaaaaa (this "
            "sweep: bbbbbbbbbbbb), finished ") in section and "Versions that differ: numpy 1.26.4 → 2.0.0." in section
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in section.splitlines() if line.startswith("| g")
            or line.startswith("| baseline")}
    assert sorted(rows) == ["baseline", "g2-b256", "g2-b64"]
    assert rows["g2-b64"][1] == "2/2" and rows["baseline"][1] == "1/1" and rows["baseline"][-1] == "too few repeats |"
    assert re.fullmatch(r"\+\d\.\d\d ms \[[−+]\d+\.\d\d, \+\d+\.\d\d\] \(\+(19|20|21|22)\.\d%\)", rows["g2-b64"][4])
    assert rows["g2-b64"][-1] in ("slower |", "no difference |")
    assert "Failed, so left out: g2-b128-r0 (the earlier sweep); g2-b128-r0 (this one)." in section
    html = (out / "report.html").read_text()
    assert f"<h2>{TITLE}</h2>" in html and "<td>g2-b64</td><td>2/2</td>" in html
    tex = (out / "report.tex").read_text()
    assert rf"\caption{{{TITLE}}}" in tex and r"numpy 1.26.4 $\rightarrow$ 2.0.0" in tex
    data = json.loads((out / "report.json").read_text())
    last = data["against_last_sweep"]
    assert last["commit"] == "a" * 40 and last["this_commit"] == "b" * 40
    assert last["versions_differ"] == ["numpy 1.26.4 -> 2.0.0"]
    assert [p["point"] for p in last["points"]] == ["baseline", "g2-b64", "g2-b256"]
    assert data["sections"][0]["title"] == TITLE and data["sections"][0]["intro"]
    assert "--store" in data["provenance"]["report_command"]

    db = open_store(f"sqlite:///{store}", create=False)
    try:
        found = select_runs(db, Selection.parse("site=local"))
    finally:
        db.close()
    assert len(found) == 9 and {r.hardware for r in found} == {"x86-64 CPU core (float32)"}
    assert {r.tolerance for r in found} == {0.02} and {r.commit for r in found if r.outcome == "succeeded"} == {
        "a" * 40, "b" * 40}


def test_the_site_store_is_the_environments_when_it_names_one(tmp_path, capsys, monkeypatch):
    store = tmp_path / "env.sqlite"
    monkeypatch.setenv("FIRESCALE_RESULTS_URL", f"sqlite:///{store}")
    results = _sweep(tmp_path / "runs", random.Random(1), commit="c" * 40)
    assert _report(results, tmp_path / "out", "site") == 0
    assert f"{store}: 5 runs added" in capsys.readouterr().out and store.is_file()
