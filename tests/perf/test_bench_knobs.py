"""`firescale bench knobs`: the trainer's iteration under settings of a site's Horovod knobs.

The timings are the benchmark's to print; the tests check what must hold whatever the load: which
settings run and in what order, that each setting reaches the ranks (the run record's knobs and
mode), and that a cycle far longer than the iteration paces it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli import run_firescale
from firescale.bench.knobs import KnobRow, Setting, compare_knobs, knob_settings, parse_knob
from firescale.errors import FirescaleError


def test_the_sites_own_setting_runs_first_and_each_setting_once():
    settings = knob_settings({"cycle_time_ms": 0.1, "cache_capacity": 0},
                             {"cycle_time_ms": [0.1, 1.0], "fusion_threshold_mb": [None]}, [False, True])
    assert [s.label for s in settings] == [
        "site, grouped", "site, overlapped", "cycle_time_ms=1, grouped", "cycle_time_ms=1, overlapped"]
    # keys not varied keep the site's value; a varied key takes each value in turn
    assert settings[2].environment() == {"HOROVOD_CYCLE_TIME": "1", "HOROVOD_CACHE_CAPACITY": "0"}
    assert [s.overlap for s in settings] == [False, True, False, True]
    # 'default' (None) leaves the key out: Horovod's own value
    (_, dropped) = knob_settings({"cycle_time_ms": 0.1}, {"cycle_time_ms": [None]}, [False])
    assert dropped.label == "cycle_time_ms=default, grouped" and dropped.environment() == {}


@pytest.mark.parametrize("text, message", [
    ("cycle=1", "KEY one of fusion_threshold_mb, cycle_time_ms"),
    ("cycle_time_ms", "expected KEY=VALUE"),
    ("cycle_time_ms=fast", "'fast' is neither a number, true, false nor 'default'"),
    ("cycle_time_ms=-1", "--knob.cycle_time_ms: -1.0 is not allowed"),
    ("hierarchical_allreduce=1", "--knob.hierarchical_allreduce: 1.0 is not allowed"),
])
def test_a_bad_knob_value_is_refused_naming_it(text, message):
    with pytest.raises(FirescaleError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_knob(text)


def test_a_good_knob_value_parses_to_what_the_site_file_would_hold():
    assert parse_knob("fusion_threshold_mb=0,64,default") == ("fusion_threshold_mb", [0.0, 64.0, None])
    assert parse_knob("group_fusion=true,false") == ("group_fusion", [True, False])


def test_the_order_rotates_and_reverses_between_rounds_and_each_run_lands_in_its_row():
    settings = [Setting({}, False), Setting({}, True), Setting({"cycle_time_ms": 5}, False, (("cycle_time_ms", 5),))]
    calls: list[tuple[int, int]] = []

    def run(setting: Setting, batch: int, name: str) -> float:
        i = settings.index(setting)
        calls.append((batch, i))
        return (10 * i + batch + len(calls) / 1000) / 1e3

    rows = compare_knobs(run, settings, [2, 8], 3)
    assert calls == [(2, 0), (2, 1), (2, 2), (8, 0), (8, 1), (8, 2),      # round 1: as given
                     (2, 0), (2, 2), (2, 1), (8, 0), (8, 2), (8, 1),      # round 2: rotated by one, reversed
                     (2, 2), (2, 0), (2, 1), (8, 2), (8, 0), (8, 1)]      # round 3: rotated by two
    for batch, batch_rows in rows.items():
        for i, row in enumerate(batch_rows):
            assert row.setting is settings[i] and row.batch_per_rank == batch and len(row.iteration_s) == 3
            assert all(int(round(s * 1e3 - 0.5)) == 10 * i + batch for s in row.iteration_s)
    with pytest.raises(FirescaleError, match="need repeats >= 1"):
        compare_knobs(run, settings, [2], 0)


def test_a_setting_is_clearly_faster_only_when_every_run_beats_every_run_of_the_sites():
    site = KnobRow(Setting({}, False), 8, [2.0e-3, 2.2e-3, 2.6e-3])
    assert KnobRow(Setting({}, True), 8, [1.7e-3, 1.9e-3, 1.95e-3]).clearly_faster(site)
    overlapping = KnobRow(Setting({}, True), 8, [1.5e-3, 1.6e-3, 2.1e-3])
    assert not overlapping.clearly_faster(site)
    assert overlapping.change_percent(site) == pytest.approx((1.6 - 2.2) / 2.2 * 100)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_each_setting_reaches_the_ranks_and_a_long_cycle_paces_the_iteration(tmp_path, repo, digits_dataset):
    out, runs = tmp_path / "knobs.json", tmp_path / "runs"
    proc = run_firescale("bench", "knobs", "--dataset", digits_dataset, "--knob", "cycle_time_ms=20", "--mode",
                         "overlapped", "--batch-per-rank", "4", "--iterations", "15", "--repeats", "1", "--workdir",
                         runs, "--json", out, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site_row, slow_row = json.loads(out.read_text())["rows"]
    assert (site_row["setting"], slow_row["setting"]) == ("site, grouped", "cycle_time_ms=20, overlapped")
    # what each run's ranks saw, from its own record: the site's knobs and the grouped allreduce, then the
    # 20 ms cycle and the overlapped one
    site_run = json.loads((runs / "b4-s0-0" / "result.json").read_text())["allreduce"]
    slow_run = json.loads((runs / "b4-s1-0" / "result.json").read_text())["allreduce"]
    assert site_run["horovod_knobs"] == site_row["environment"] == {"HOROVOD_CYCLE_TIME": "0.1"}
    assert slow_run["horovod_knobs"] == slow_row["environment"] == {"HOROVOD_CYCLE_TIME": "20"}
    assert (site_run["overlap"], slow_run["overlap"]) == (False, True)
    # each iteration's allreduce waits for a cycle: no iteration beats a 20 ms cycle (a little less for the
    # timer's grain), whatever else runs on the machine; the site's 0.1 ms cycle lets the iteration run faster
    # (beside another test worker its 15 iterations took 10.4 ms each once, so no fixed bound for it)
    assert slow_row["median_s"] > 0.018 and site_row["median_s"] < slow_row["median_s"]
    assert slow_row["change_percent"] == pytest.approx(
        (slow_row["median_s"] - site_row["median_s"]) / site_row["median_s"] * 100)
    assert "cycle_time_ms=20, overlapped" in proc.stdout and "vs site" in proc.stdout


def test_the_command_refuses_one_rank_and_a_grid_of_only_the_sites_setting(tmp_path, repo):
    (tmp_path / "manifest.json").write_text("{}")
    for extra, message in [(["--ranks", "1"], "give one rank count of 2 or more"),
                           (["--mode", "grouped", "--knob", "cycle_time_ms=0.1"], "nothing to compare")]:
        proc = subprocess.run([sys.executable, "-m", "firescale", "bench", "knobs", "--dataset", str(tmp_path), *extra],
                              capture_output=True, text=True, cwd=repo)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_pytorch_trainers_knob_is_its_buckets_size_which_only_an_overlapped_run_has():
    assert parse_knob("bucket_mb=1,25,default", "pytorch") == ("bucket_mb", [1.0, 25.0, None])
    for text, message in [("cycle_time_ms=1", "KEY one of bucket_mb"), ("bucket_mb=0", "--knob.bucket_mb: 0.0 is not"),
                          ("bucket_mb=true", "--knob.bucket_mb: True is not")]:
        with pytest.raises(FirescaleError, match=message.replace(".", r"\.")):
            parse_knob(text, "pytorch")
    with pytest.raises(FirescaleError, match="KEY one of fusion_threshold_mb"):
        parse_knob("bucket_mb=1", "tensorflow")
    settings = knob_settings({}, {"bucket_mb": [1.0, 25.0]}, [False, True], "pytorch")
    # a grouped run sums once after backward: no bucket, so one grouped setting, the site's
    assert [s.label for s in settings] == ["site, grouped", "bucket_mb=1, overlapped", "bucket_mb=25, overlapped"]
    assert settings[1].environment() == {"FIRESCALE_BUCKET_MB": "1"} and settings[0].environment() == {}
    assert all(s.framework == "pytorch" for s in settings)
    row = KnobRow(settings[1], 8, [1e-3])
    assert row.to_dict(row)["torch"] == {"bucket_mb": 1.0} and "horovod" not in row.to_dict(row)


@pytest.mark.slow
@pytest.mark.pytorch
@pytest.mark.mpi
def test_a_bucket_size_reaches_the_pytorch_trainers_ranks(tmp_path, repo, digits_dataset):
    out, runs = tmp_path / "knobs.json", tmp_path / "runs"
    proc = run_firescale("bench", "knobs", "--framework", "pytorch", "--dataset", digits_dataset, "--knob",
                         "bucket_mb=0.1", "--mode", "overlapped", "--batch-per-rank", "4", "--iterations", "10",
                         "--repeats", "1", "--workdir", runs, "--json", out, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    site_row, small_row = data["rows"]
    assert data["framework"] == "pytorch" and small_row["setting"] == "bucket_mb=0.1, overlapped"
    site_run = json.loads((runs / "b4-s0-0" / "result.json").read_text())["allreduce"]
    small_run = json.loads((runs / "b4-s1-0" / "result.json").read_text())["allreduce"]
    assert (site_run["overlap"], site_run["bucket_bytes"]) == (False, None)
    assert (small_run["overlap"], small_run["bucket_bytes"]) == (True, int(0.1 * 2**20))
    assert small_run["controller"] == "mpi4py" and small_run["process_group"] == "mpi"   # auto under mpirun
    assert small_row["median_s"] > 0
