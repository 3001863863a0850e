"""Comparing stored runs in a real SQLite store: verdicts with Welch's intervals, refusals, `results compare`."""
from __future__ import annotations

import json
import random

import pytest
from store_records import hand_made, noisy_sweep

from firescale.cli import main
from firescale.errors import FirescaleError
from firescale.report.comparison import compare_runs
from firescale.store.add import add_runs
from firescale.store.compare import compare_selections, last_sweep, selected, versions_differ
from firescale.store.database import open_store
from firescale.store.runs import RunContext, stored_run
from firescale.store.select import Selection, select_runs

OLD, NEW = "a" * 40, "b" * 40


@pytest.fixture
def db(tmp_path):
    return tmp_path / "store.sqlite"


def _add(db, records, commit="unknown"):
    store = open_store(f"sqlite:///{db}")
    try:
        report = add_runs(store, [stored_run(raw, RunContext(commit=commit), where=raw["point"]) for raw in records])
    finally:
        store.close()
    return report


def _compare(db, a="commit=aaaa", b="commit=bbbb"):
    store = open_store(f"sqlite:///{db}", create=False)
    try:
        return compare_selections(select_runs(store, Selection.parse(a)), select_runs(store, Selection.parse(b)))
    finally:
        store.close()


def _two_sweeps(db, seed, repeats=3, slower=1.0):
    rng = random.Random(seed)
    _add(db, noisy_sweep(rng, repeats, commit=OLD))
    _add(db, noisy_sweep(rng, repeats, slower=slower, commit=NEW))


def test_a_fifth_slower_per_iteration_is_slower_with_an_interval_above_zero(db):
    _two_sweeps(db, 52, slower=1.2)
    comparison = _compare(db)
    assert [p.point for p in comparison.points] == ["baseline", "g2-b64", "g2-b256"]
    for point in comparison.points:
        d = point.diff("iteration_s")
        assert point.verdict == "slower" and (point.a.n, point.b.n) == (3, 3)
        assert d is not None and d.interval is not None and 0 < d.interval.low < d.value < d.interval.high
        assert point.iteration_pct == pytest.approx(20.0, abs=4.0)
        assert point.diff("train_time_s").value > 0 and point.diff("top1").value == pytest.approx(0.0)
    assert comparison.regression and len(comparison.slower) == 3
    assert comparison.to_dict()["verdicts"] == {"slower": 3}


def test_two_sets_of_repeats_of_the_same_code_are_no_different(db):
    _two_sweeps(db, 7)
    comparison = _compare(db)
    assert [p.verdict for p in comparison.points] == ["no difference"] * 3
    for point in comparison.points:
        interval = point.diff("iteration_s").interval
        assert interval is not None and interval.low < 0 < interval.high
        assert point.a.mean("speedup") is not None and point.b.mean("speedup") is not None
    assert not comparison.regression


def test_one_repeat_is_too_few_and_a_point_one_side_lacks_is_named(db):
    rng = random.Random(1)
    _add(db, noisy_sweep(rng, 1, commit=OLD) + [hand_made("g2-b128-r0")], commit=OLD)
    _add(db, [r for r in noisy_sweep(rng, 2, slower=1.2, commit=NEW) if r["point"].startswith("baseline")])
    comparison = _compare(db)
    assert {p.point: p.verdict for p in comparison.points} == {
        "baseline": "too few repeats", "g2-b64": "only in A", "g2-b256": "only in A"}
    base = comparison.points[0]
    assert base.diff("iteration_s").interval is None and base.iteration_pct == pytest.approx(20.0, abs=6.0)
    assert comparison.a_failed == ("g2-b128-r0",) and comparison.b_failed == ()
    assert not comparison.regression
    swapped = compare_runs([r.run_record() for r in _runs(db, "commit=bbbb")],
                           [r.run_record() for r in _runs(db, "commit=aaaa")])
    assert [p.verdict for p in swapped.points][1:] == ["only in B", "only in B"]


def _runs(db, text):
    store = open_store(f"sqlite:///{db}", create=False)
    try:
        return select_runs(store, Selection.parse(text))
    finally:
        store.close()


def test_different_experiments_or_nets_and_empty_selections_are_refused(db):
    rng = random.Random(2)
    _add(db, noisy_sweep(rng, 2, commit=OLD))
    _add(db, noisy_sweep(rng, 2, commit=NEW, experiment="fashion-lenet"))
    with pytest.raises(FirescaleError, match="^A and B are different experiments: A holds digits-lenet, B "
                                             "fashion-lenet; compare runs of one experiment$"):
        _compare(db)
    with pytest.raises(FirescaleError, match=r"^A holds runs of several experiments \(digits-lenet, fashion-lenet\)"):
        _compare(db, "site=local", "commit=bbbb")
    other_net = noisy_sweep(rng, 2, commit="c" * 40)
    for raw in other_net:
        raw["train"]["net"] = "lenet_bn"
    _add(db, other_net)
    with pytest.raises(FirescaleError, match="^A and B are different nets: A holds lenet_same, B lenet_bn"):
        _compare(db, "commit=aaaa", "commit=cccc")
    store = open_store(f"sqlite:///{db}", create=False)
    with pytest.raises(FirescaleError, match=f"^selection commit=dddd \\(B\\) matches no runs in {db}"):
        selected(store, Selection.parse("commit=dddd"), "B")
    store.close()


def _cli(capsys, *argv):
    status = main(["results", "compare", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_results_compare_exits_3_on_a_regression_only_with_fail_on_regression(db, tmp_path, capsys):
    _two_sweeps(db, 52, slower=1.2)
    out = tmp_path / "compare.json"
    status, printed, _ = _cli(capsys, "commit=aaaa", "commit=bbbb", "--store", str(db), "--json", str(out),
                              "--fail-on-regression")
    assert status == 3
    lines = printed.splitlines()
    assert lines[0].split()[:3] == ["point", "n", "A/B"] and len(lines) == 7
    assert lines[1].startswith("baseline") and lines[1].endswith("slower") and "3/3" in lines[1]
    assert "3 points, 3 slower" in lines[4] and lines[5] == f"wrote {out}"
    assert lines[6].startswith("regression: slower in B beyond the 95% interval: baseline (+")
    data = json.loads(out.read_text())
    assert data["regression"] is True and [p["verdict"] for p in data["points"]] == ["slower"] * 3
    assert data["points"][0]["difference"]["iteration_s"]["interval"]["low"] > 0
    assert _cli(capsys, "commit=aaaa", "commit=bbbb", "--store", str(db))[0] == 0   # reported, not failed


def test_results_compare_of_the_same_code_exits_0_and_reads_the_store_the_environment_names(db, capsys,
                                                                                           monkeypatch):
    _two_sweeps(db, 7)
    monkeypatch.setenv("FIRESCALE_RESULTS_URL", str(db))
    status, printed, _ = _cli(capsys, "site=local,commit=aaaa", "site=local,commit=bbbb", "--fail-on-regression")
    assert status == 0 and "3 points, 3 no difference" in printed and "regression" not in printed


def test_results_compare_errors_are_one_sentence(db, capsys):
    _two_sweeps(db, 7)
    status, _, err = _cli(capsys, "commit=aaaa", "comit=bbbb", "--store", str(db))
    assert status == 1 and "unknown key 'comit'; did you mean 'commit'?" in err
    status, _, err = _cli(capsys, "commit=aaaa", "commit=ffff", "--store", str(db))
    assert status == 1 and err.startswith("firescale: error: selection commit=ffff (B) matches no runs in ")
    status, _, err = _cli(capsys, "commit=aaaa", "commit=bbbb", "--store", str(db.parent / "none.sqlite"))
    assert status == 1 and "does not exist" in err


def test_the_last_sweep_is_the_newest_earlier_one_with_other_code_or_versions(db):
    rng = random.Random(5)
    first = _add(db, noisy_sweep(rng, 2, commit=OLD))
    same = _add(db, noisy_sweep(rng, 2, commit=OLD))          # the same code again: not "another" sweep
    newer = _add(db, noisy_sweep(rng, 2, commit=OLD, versions={"numpy": "2.0.0"}))
    store = open_store(f"sqlite:///{db}", create=False)
    try:
        earlier = last_sweep(store, "local", "digits-lenet", newer.sweeps[0])
        assert earlier is not None and earlier.key == same.sweeps[0] and earlier.differs == ("numpy 1.26.4 -> 2.0.0",)
        assert last_sweep(store, "local", "digits-lenet", same.sweeps[0]) is None
        assert last_sweep(store, "local", "digits-lenet", first.sweeps[0]) is None
        assert last_sweep(store, "vcluster", "digits-lenet", newer.sweeps[0]) is None
    finally:
        store.close()
    differ = versions_differ({"a": "1", "commit": "x"}, {"a": "2", "b": "3", "commit": "y"})
    assert differ == ("a 1 -> 2", "b not recorded -> 3")
