"""`firescale results table` over real SQLite stores: rows by site, another site's baseline, published rows."""
from __future__ import annotations

import csv
import random
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from store_records import noisy_sweep

from firescale.cli import main
from firescale.cluster.site import load_site
from firescale.store.add import add_runs
from firescale.store.database import URL_VARIABLE, open_store
from firescale.store.runs import RunContext, stored_run

REPO = Path(__file__).resolve().parents[2]
EXP = "fashion-lenet"
SLOWER = {"local": 1.0, "vcluster": 1.3}


@pytest.fixture(autouse=True)
def _no_store_in_the_environment(monkeypatch):
    monkeypatch.delenv(URL_VARIABLE, raising=False)


def _records(site, *, experiment=EXP, seed=0, ended=None, baseline=True):
    records = noisy_sweep(random.Random(seed), 2, slower=SLOWER.get(site, 1.0), site=site, experiment=experiment)
    for raw in records:
        if ended:
            raw["submissions"][-1]["ended"] = ended
    return [r for r in records if baseline or not r["baseline"]]


def _add(db, records):
    store = open_store(f"sqlite:///{db}")
    try:
        device = {s: load_site(s).config["device"]["name"] for s in {r["site"] for r in records}}
        add_runs(store, [stored_run(r, RunContext(hardware=device[r["site"]], tolerance=0.01), where=r["point"])
                         for r in records])
    finally:
        store.close()


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "store.sqlite"
    _add(path, _records("local") + _records("vcluster", seed=1))
    return path


def _table(capsys, out, *argv, experiment=EXP):
    status = main(["results", "table", "--experiment", experiment, "--out", str(out), *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _csv(out, experiment=EXP):
    with open(out / experiment / "table.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_the_table_has_each_sites_rows_with_its_hardware_and_its_own_baseline(db, tmp_path, capsys):
    status, printed, err = _table(capsys, tmp_path / "out", "--store", str(db), "--sites", "vcluster,local")
    assert status == 0, err
    md_path = tmp_path / "out" / EXP / "table.md"
    assert printed.strip() == f"{md_path}: {EXP} on vcluster, local (6 measured rows, 0 published)"
    rows = _csv(tmp_path / "out")
    assert [r["site"] for r in rows] == ["vcluster"] * 3 + ["local"] * 3
    device = load_site("local").config["device"]["name"]
    assert {r["device"] for r in rows} == {device}
    assert [r["hardware"] for r in rows[:3]] == [f"{g} × {device}, 1 node" for g in (1, 2, 2)]
    assert [r["parity"] for r in rows[:3]] == ["baseline", "MATCHES", "BELOW BASELINE by 5.0 pts"]
    assert {r["speedup_against"] for r in rows} == {"vcluster's baseline", "local's baseline"}
    assert float(rows[3]["speedup_mean"]) == pytest.approx(1.0, abs=0.01)
    assert all(r["repeats"] == "2" and r["kind"] == "measured" for r in rows)
    md = (tmp_path / "out" / EXP / "table.md").read_text()
    assert "| Hardware | Site | Framework | Net | Epochs | Batch | Initial LR | Train time | Speedup |" in md
    assert f"| 2 × {device}, 1 node | local | tensorflow, fp32 | lenet_same |" in md
    assert "against its own baseline (vcluster: 1 × " in md
    tex = (tmp_path / "out" / EXP / "table.tex").read_text()
    assert r"\begin{tabular}" in tex and r"$\times$" in tex and r"\caption{fashion-lenet across vcluster, local" in tex


def _times(db, site, group):
    store = open_store(f"sqlite:///{db}", create=False)
    try:
        from firescale.store.select import Selection, select_runs

        return [r.train_time_s for r in select_runs(store, Selection.parse(f"site={site}")) if r.group == group]
    finally:
        store.close()


def test_baseline_site_takes_every_speedup_against_the_other_sites_baseline(db, tmp_path, capsys):
    status, _, err = _table(capsys, tmp_path / "out", "--store", str(db), "--baseline-site", "vcluster")
    assert status == 0, err
    rows = _csv(tmp_path / "out")
    base = statistics.fmean(_times(db, "vcluster", "baseline"))
    local_g2 = next(r for r in rows if r["site"] == "local" and r["gpus"] == "2" and r["batch"] == "64")
    expected = statistics.fmean(base / t for t in _times(db, "local", "g2-b64"))
    assert float(local_g2["speedup_mean"]) == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(1.3 * 1.64, rel=0.05)   # local is 1.3 times as fast as vcluster
    assert {r["speedup_against"] for r in rows} == {"vcluster's baseline"}
    local_base = next(r for r in rows if r["site"] == "local" and r["gpus"] == "1")
    assert local_base["parity"] == "MATCHES" and float(local_base["speedup_mean"]) == pytest.approx(1.3, rel=0.05)
    assert [r["parity"] for r in rows if r["site"] == "vcluster"][0] == "baseline"
    md = (tmp_path / "out" / EXP / "table.md").read_text()
    assert "every measured row's speedup and parity are against vcluster's baseline (1 × " in md


def test_published_rows_of_the_shipped_firecaffe_table_sit_beside_the_measured_ones(db, tmp_path, capsys):
    status, printed, err = _table(capsys, tmp_path / "out", "--store", str(db), "--reference", "firecaffe-table2")
    assert status == 0, err
    assert "(6 measured rows, 6 published)" in printed
    rows = _csv(tmp_path / "out")
    published = [r for r in rows if r["kind"] == "published"]
    assert len(published) == 6 and rows[-6:] == published
    titan = next(r for r in published if r["gpus"] == "128")
    assert titan["hardware"] == "128 × K20" and titan["site"] == "Titan" and titan["speedup_against"] == "as published"
    assert float(titan["speedup_mean"]) == 39 and float(titan["time_s_mean"]) == pytest.approx(3.6 * 3600)
    assert titan["source"] == "FireCaffe (Iandola et al., CVPR 2016), Table 2"
    md = (tmp_path / "out" / EXP / "table.md").read_text()
    assert "| 128 × K20 | Titan | FireCaffe-batch1024 | nin | 47.0 | 1024 | 0.04 | 3.60 h | 39× | 58.6% |" in md
    assert "give their speedups as printed there" in md


def test_a_reference_file_of_ones_own_is_read_too(db, tmp_path, capsys):
    ref = tmp_path / "mine.csv"
    ref.write_text("net,hardware,train_time_h,speedup,top1,source\nlenet_same,4 V100,0.01,3.5,0.94,Our paper\n")
    assert _table(capsys, tmp_path / "out", "--store", str(db), "--reference", str(ref))[0] == 0
    (mine,) = [r for r in _csv(tmp_path / "out") if r["kind"] == "published"]
    assert (mine["hardware"], mine["source"], mine["speedup_mean"]) == ("4 × V100", "Our paper", "3.5")


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.open, self.seen = [], []

    def handle_starttag(self, tag, attrs):
        self.seen.append((tag, dict(attrs)))
        if tag not in ("meta", "br"):
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open.pop() == tag


def test_the_html_is_a_complete_page(db, tmp_path, capsys):
    assert _table(capsys, tmp_path / "out", "--store", str(db), "--reference", "firecaffe-table2")[0] == 0
    text = (tmp_path / "out" / EXP / "table.html").read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    parser = _Tags()
    parser.feed(text)
    assert parser.open == []
    tags = [t for t, _ in parser.seen]
    assert tags[:5] == ["html", "head", "meta", "title", "style"] and "caption" in tags
    classes = [a.get("class") for t, a in parser.seen if t == "tr"]
    assert classes.count("published") == 5 and classes.count("published first") == 1
    assert '<td class="matches parity">MATCHES</td>' in text and 'class="below parity">BELOW BASELINE' in text


def test_each_site_shows_its_newest_sweep_unless_a_selection_narrows_it(tmp_path, capsys):
    db = tmp_path / "store.sqlite"
    _add(db, _records("local", ended="2026-11-01T10:00:00") + _records("vcluster", seed=1))
    _add(db, _records("local", seed=5, ended="2026-12-01T10:00:00"))
    assert _table(capsys, tmp_path / "out", "--store", str(db))[0] == 0
    rows = _csv(tmp_path / "out")
    assert len(rows) == 6 and len({r["sweep"] for r in rows}) == 2
    md = (tmp_path / "out" / EXP / "table.md").read_text()
    assert "finished 2026-12-01T" in md and "the newest of its 2 sweeps" in md
    assert _table(capsys, tmp_path / "old", "--store", str(db), "--select", "until=2026-11-15")[0] == 0
    assert "finished 2026-11-01T" in (tmp_path / "old" / EXP / "table.md").read_text()
    # A selection naming a site narrows that site's runs alone: local's older sweep beside vcluster's.
    assert _table(capsys, tmp_path / "one", "--store", str(db), "--select", "site=local,until=2026-11-15")[0] == 0
    md = (tmp_path / "one" / EXP / "table.md").read_text()
    assert "finished 2026-11-01T" in md and "vcluster: sweep" in md
    status, _, err = _table(capsys, tmp_path / "two", "--store", str(db), "--select", "until=2026-11-15",
                            "--select", "since=2026-11-01")
    assert status == 1 and "at most one selection without site=" in err


def test_a_failed_point_has_a_row_that_says_so(tmp_path, capsys):
    from store_records import hand_made

    failed = hand_made("g2-b128-r0") | {"site": "local", "experiment": EXP}
    db = tmp_path / "store.sqlite"
    _add(db, _records("local") + [failed] + _records("vcluster", seed=1))
    assert _table(capsys, tmp_path / "out", "--store", str(db))[0] == 0
    (row,) = [r for r in _csv(tmp_path / "out") if r["kind"] == "failed"]
    assert row["parity"].startswith("FAILED: ended by walltime") and row["time_s_mean"] == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["--experiment", "nin-imagenet"], "no runs of experiment 'nin-imagenet' in {db}; `firescale results add`"),
    (["--sites", "local,titan"], "site 'titan' has no runs of experiment 'fashion-lenet' in {db} "
                                 "(sites with runs: local, vcluster)"),
    (["--baseline-site", "vcluster"], "--baseline-site vcluster: its newest sweep of 'fashion-lenet' ("),
    (["--baseline-site", "titan"], "--baseline-site titan: that site has no runs of experiment 'fashion-lenet'"),
])
def test_refusals_are_one_sentence_and_write_nothing(tmp_path, capsys, argv, message):
    db = tmp_path / "store.sqlite"
    _add(db, _records("local") + _records("vcluster", seed=1, baseline=False))
    argv = argv if argv[0] == "--experiment" else ["--experiment", EXP, *argv]
    status = main(["results", "table", *argv, "--store", str(db), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("firescale: error: " + message.format(db=db))
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def _config(tmp_path, experiments):
    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    lenet = config["experiments"][EXP]
    config["experiments"] = {name: {**lenet, "sites": {s: None for s in sites}} for name, sites in experiments.items()}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_all_writes_a_table_for_each_experiment_on_more_than_one_site_and_an_index(tmp_path, capsys, monkeypatch):
    # No --store: each site's own (local and vcluster share ./.firescale-work/results, read once).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FIRESCALE_SITE_PATH", str(REPO / "site"))
    db = tmp_path / ".firescale-work" / "results" / "firescale-results.sqlite"
    _add(db, _records("local") + _records("vcluster", seed=1) + _records("local", experiment="solo", seed=2))
    config = _config(tmp_path, {EXP: ["local", "vcluster"], "solo": ["local", "vcluster"],
                                "elsewhere": ["titan", "ib-cluster"]})
    status, printed, err = _table(capsys, tmp_path / "tables", "--config", str(config), experiment="all")
    assert status == 0, err
    assert printed.splitlines() == [f"{tmp_path / 'tables' / EXP / 'table.md'}: {EXP} on local, vcluster "
                                    f"(6 measured rows, 0 published)", f"{tmp_path / 'tables' / 'index.md'}: 1 table"]
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [EXP, "index.md"]
    index = (tmp_path / "tables" / "index.md").read_text()
    assert f"| {EXP} | local, vcluster | 6 | [{EXP}/table.md]({EXP}/table.md)" in index


def test_all_with_no_experiment_on_two_sites_says_so_in_the_index(tmp_path, capsys):
    db = tmp_path / "store.sqlite"
    _add(db, _records("local"))
    config = _config(tmp_path, {EXP: ["local", "vcluster"]})
    status, printed, err = _table(capsys, tmp_path / "tables", "--config", str(config), "--store", str(db),
                                  experiment="all")
    assert status == 0, err
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == ["index.md"]
    assert "No experiment has runs on more than one site yet (experiments: fashion-lenet; stores read: " in \
        (tmp_path / "tables" / "index.md").read_text()


def test_a_named_store_needs_no_experiments_file_for_one_experiment(db, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)     # no workflow/config.yaml here
    assert _table(capsys, tmp_path / "out", "--store", str(db))[0] == 0
    assert [r["site"] for r in _csv(tmp_path / "out")] == ["local"] * 3 + ["vcluster"] * 3
    status, _, err = _table(capsys, tmp_path / "all", "--store", str(db), experiment="all")
    assert status == 1 and "no experiments file: workflow/config.yaml is not in" in err
