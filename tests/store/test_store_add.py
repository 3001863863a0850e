"""Adding runs to a real store, SQLite and PostgreSQL: each run once, sweeps kept whole, tags, selection."""
from __future__ import annotations

import json
import random
import shutil
import sqlite3

import pytest
from store_records import RUNS, noisy_sweep, repeat_of, write_sweep

from firescale.errors import FirescaleError
from firescale.store.add import add_runs, runs_in_folder
from firescale.store.database import open_store
from firescale.store.runs import RunContext, run_key, stored_run
from firescale.store.select import Selection, select_runs, sweep_rows
from firescale.store.sweeps import stored_sweeps


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return request.getfixturevalue("postgres_url")


def _stored(records, **context):
    return [stored_run(raw, RunContext(**context), where=raw["point"]) for raw in records]


def test_a_run_added_twice_is_stored_once_and_a_copy_elsewhere_is_the_same_run(store_url, tmp_path):
    store = open_store(store_url)
    first = add_runs(store, runs_in_folder(RUNS, RunContext(commit="c1")))
    assert (first.added, first.already) == (5, 0)
    again = add_runs(store, runs_in_folder(RUNS, RunContext(commit="c1")))
    assert (again.added, again.already) == (0, 5)
    moved = shutil.copytree(RUNS, tmp_path / "elsewhere" / "runs")
    assert add_runs(store, runs_in_folder(moved, RunContext(commit="c1"))).added == 0
    found = select_runs(store, Selection())
    assert sorted(r.point for r in found) == ["baseline", "g2-b128-r0", "g2-b256-r0", "g2-b64-r0", "g2-b64-r1"]
    assert len({r.run_key for r in found}) == 5 and len(sweep_rows(store, Selection())) == 1
    failed = next(r for r in found if r.point == "g2-b128-r0")
    assert failed.outcome == "failed" and failed.iteration_s is None
    store.close()


def test_a_resumed_sweep_adds_only_its_new_points_to_the_sweep_it_began(store_url, tmp_path):
    records = noisy_sweep(random.Random(3), 2)
    store = open_store(store_url)
    early = add_runs(store, _stored(records[:4], commit="c1"))
    late = add_runs(store, _stored(records, commit="c1"))
    assert (early.added, late.added, late.already) == (4, 2, 4)
    assert early.sweeps == late.sweeps
    (sweep,) = stored_sweeps(select_runs(store, Selection()))
    assert sweep.points == 6
    # A sweep that trained its baseline again is another sweep.
    other = add_runs(store, _stored(noisy_sweep(random.Random(4), 2), commit="c2"))
    assert other.added == 6 and other.sweeps != early.sweeps
    assert len(sweep_rows(store, Selection())) == 2
    store.close()


def test_selection_by_site_commit_tag_framework_and_dates(store_url):
    rng = random.Random(5)
    store = open_store(store_url)
    add_runs(store, _stored(noisy_sweep(rng, 1, commit="aaaa1111")), tag="before")
    add_runs(store, _stored(noisy_sweep(rng, 1, site="vcluster", commit="bbbb2222")), tag="after")
    add_runs(store, _stored(noisy_sweep(rng, 1, commit="aaaa1111")), tag="after")

    def points(text):
        return len(select_runs(store, Selection.parse(text)))

    assert points("") == 9
    assert points("site=local") == 6 and points("site=vcluster") == 3
    assert points("commit=aaaa") == 6 and points("commit=bbbb2222") == 3 and points("commit=cccc") == 0
    assert points("tag=before") == 3 and points("tag=after") == 6 and points("tag=after,site=local") == 3
    assert points("framework=tensorflow,precision=fp32") == 9 and points("framework=pytorch") == 0
    # finished_at is the last submission's end in the hand-made records: 2024-05-01.
    assert points("since=2024-05-01,until=2024-05-01") == 9
    assert points("since=2024-05-02") == 0 and points("until=2024-04-30") == 0
    store.close()


def test_tags_attach_to_runs_already_stored_and_nothing_else_changes(store_url):
    store = open_store(store_url)
    runs = _stored(noisy_sweep(random.Random(6), 1))
    add_runs(store, runs)
    before = {r.run_key: r.record for r in select_runs(store, Selection())}
    report = add_runs(store, runs, tag="nightly")
    assert (report.added, report.tagged) == (0, 3)
    assert add_runs(store, runs, tag="nightly").tagged == 0
    after = select_runs(store, Selection.parse("tag=nightly"))
    assert {r.run_key: r.record for r in after} == before and all(r.tags == ("nightly",) for r in after)
    store.close()


def test_a_stored_record_reads_back_whole(store_url):
    raw = repeat_of("g2-b64-r0", 0, iteration_s=0.01, seed=9, commit="deadbeef", versions={"numpy": "2.0.0"})
    store = open_store(store_url)
    add_runs(store, _stored([raw], hardware="x86-64 CPU core", tolerance=0.02,
                             predictions={"g2-b64": {"iteration_s": 0.011, "time_to_accuracy_s": 70.0}}))
    (run,) = select_runs(store, Selection())
    assert run.record == raw and run.run_key == run_key(raw)
    assert run.commit == "deadbeef" and run.versions["numpy"] == "2.0.0" and "hostname" not in run.versions
    assert run.hardware == "x86-64 CPU core" and run.tolerance == 0.02
    assert run.predicted_iteration_s == 0.011 and run.iteration_s == pytest.approx(0.01)
    assert run.run_record().train.evals[-1].top1 == raw["train"]["evals"][-1]["top1"]
    store.close()


def test_old_records_take_framework_from_their_versions_and_new_ones_say_it():
    old = repeat_of("g2-b64-r0", 0)
    assert stored_run(old, RunContext(), where="old").framework == "tensorflow"
    torch_run = repeat_of("g2-b64-r0", 0, versions={"torch": "2.13.0"})
    del torch_run["train"]["versions"]["tensorflow"]
    assert stored_run(torch_run, RunContext(), where="t").framework == "pytorch"
    new = repeat_of("g2-b64-r0", 0, versions={"framework": "pytorch", "precision": "bf16"})
    run = stored_run(new, RunContext(framework="tensorflow", precision="fp32"), where="new")
    assert (run.framework, run.precision) == ("pytorch", "bf16")
    assert stored_run(old, RunContext(precision="bf16"), where="old").precision == "bf16"


def test_sqlite_store_never_uses_wal_and_records_its_version(tmp_path):
    path = tmp_path / "s.sqlite"
    open_store(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        meta = dict(conn.execute("select key, value from store_meta"))
    assert meta == {"format": "firescale.store", "schema_version": "2"}


def test_list_prints_one_line_per_sweep_with_its_best_speedup_at_parity(tmp_path, capsys):
    from firescale.cli import main

    store = tmp_path / "s.sqlite"
    assert main(["results", "add", str(RUNS), "--store", str(store), "--tag", "t"]) == 0
    assert "5 runs added, 0 already there, tag 't' attached to 5 (1 sweep)" in capsys.readouterr().out
    assert main(["results", "add", str(RUNS), "--store", str(store)]) == 0
    assert "0 runs added, 5 already there" in capsys.readouterr().out
    write_sweep(tmp_path / "b" / "runs", noisy_sweep(random.Random(8), 1, experiment="other-exp"))
    assert main(["results", "add", str(tmp_path / "b" / "runs"), "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["results", "list", "--store", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["sweep", "site", "experiment"]
    digits = next(line for line in lines if "digits-lenet" in line)
    # The hand-made baseline took 60 s; g2-b64's repeats 40 s and 42 s, within the tolerance: 1.46x.
    assert digits.split()[-2:] == ["1.46x", "(g2-b64)"] and " 5 " in digits
    assert main(["results", "list", "--store", str(store), "--experiment", "other-exp"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_json_in_the_store_is_the_record_not_its_path(tmp_path):
    raw = json.loads((RUNS / "baseline" / "result.json").read_text())
    assert run_key(raw) == run_key({**raw, "source": str(tmp_path)})
    assert run_key(raw) != run_key({**raw, "queue_s": 6.0})


def test_a_missing_placeholder_is_not_stored():
    raw = repeat_of("g2-b64-r0", 0)
    raw.update(outcome="missing")
    with pytest.raises(FirescaleError, match="key 'outcome' is 'missing'"):
        stored_run(raw, RunContext(), where="x")


def test_a_sweep_that_trained_its_baseline_again_shares_the_runs_it_kept(store_url):
    """As when a resumed sweep's experiment changed: some points trained again, baseline among them, the rest
    kept from the sweep before. The new sweep holds all it reported, the old one all it had."""
    rng = random.Random(11)
    first = noisy_sweep(rng, 2)
    again = [raw for raw in noisy_sweep(rng, 2) if raw["point"] in ("baseline", "g2-b64-r1")]
    kept = [raw for raw in first if raw["point"] not in ("baseline", "g2-b64-r1")]
    store = open_store(store_url)
    add_runs(store, _stored(first, commit="c1"))
    report = add_runs(store, _stored(again + kept, commit="c2"))
    assert (report.added, report.already) == (2, 4)
    old, new = stored_sweeps(select_runs(store, Selection()))
    assert old.points == new.points == 6 and len({r.run_key for r in old.runs} & {r.run_key for r in new.runs}) == 4
    assert len(select_runs(store, Selection())) == 8                   # each run once, whatever holds it
    assert len(select_runs(store, Selection.parse(f"sweep={new.key[:10]}"))) == 6
    store.close()


def test_list_names_every_backend_a_sweep_trained_with(tmp_path, capsys):
    from firescale.cli import main

    records = noisy_sweep(random.Random(12), 1)
    records[-1]["train"]["versions"].update(framework="pytorch", torch="2.13.0")
    write_sweep(tmp_path / "runs", records)
    store = tmp_path / "s.sqlite"
    assert main(["results", "add", str(tmp_path / "runs"), "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["results", "list", "--store", str(store)]) == 0
    assert " pytorch+tensorflow " in capsys.readouterr().out.splitlines()[1]
