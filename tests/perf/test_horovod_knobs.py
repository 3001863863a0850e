"""Horovod's knobs per site: the schema key, the variables a job exports, the launcher here and the run record."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
from site_helpers import site_copy  # noqa: E402

from firescale.cluster.horovod import KNOBS, horovod_environment, recorded_knobs
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError

KNOBS_SET = {"fusion_threshold_mb": 32, "cycle_time_ms": 0.25, "cache_capacity": 0,
             "hierarchical_allreduce": True, "group_fusion": False}


def test_each_knob_becomes_horovods_variable_in_horovods_units():
    env = horovod_environment(KNOBS_SET)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "0.25",
                   "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
                   "HOROVOD_DISABLE_GROUP_FUSION": "1"}
    assert horovod_environment({"group_fusion": True, "hierarchical_allreduce": False}) == {
        "HOROVOD_DISABLE_GROUP_FUSION": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}
    assert horovod_environment(None) == {}
    # the run records exactly the knobs' variables the ranks saw, nothing else
    assert recorded_knobs({**env, "HOROVOD_RANK": "0", "PATH": "/bin"}) == env
    assert {k.variable for k in KNOBS} == set(env)


@pytest.mark.parametrize("settings, message", [
    ({"fusion_mb": 4}, "unknown key 'fusion_mb'; known: fusion_threshold_mb"),
    ({"cycle_time_ms": True}, "horovod.cycle_time_ms: True is not allowed"),
    ({"group_fusion": 1}, "horovod.group_fusion: 1 is not allowed"),
    ({"cache_capacity": -1}, "horovod.cache_capacity: -1 is not allowed"),
])
def test_a_bad_knob_is_one_sentence_naming_it(settings, message):
    with pytest.raises(FirescaleError, match=message.replace("(", r"\(")):
        horovod_environment(settings)


def test_the_site_schema_takes_the_knobs_and_refuses_others(tmp_path):
    site = load_site(site_copy(tmp_path, "ib-cluster", lambda d: d.update(horovod=KNOBS_SET)))
    assert site.config["horovod"] == KNOBS_SET
    with pytest.raises(FirescaleError, match="horovod"):
        load_site(site_copy(tmp_path, "ib-cluster", lambda d: d.update(horovod={"cycle_ms": 1}), folder="bad"))
    with pytest.raises(FirescaleError, match="horovod"):
        load_site(site_copy(tmp_path, "ib-cluster", lambda d: d.update(horovod={"cycle_time_ms": -1}), folder="neg"))


def test_the_job_script_and_the_ranks_here_export_the_sites_knobs(tmp_path):
    from firescale.cluster.ranks import site_ranks
    from firescale.jobs.render import render_job_script
    from firescale.jobs.spec import JobSpec

    site = load_site(site_copy(tmp_path, "local", lambda d: d.update(horovod={"cycle_time_ms": 0.25,
                                                                               "fusion_threshold_mb": 8})))
    job = JobSpec("k", 2, 60, ["firescale", "train"], tmp_path, tmp_path / "log", tmp_path / "status")
    script = render_job_script(site, job)
    assert f"export HOROVOD_FUSION_THRESHOLD={8 * 1024 * 1024}\n" in script
    assert "export HOROVOD_CYCLE_TIME=0.25\n" in script
    assert site_ranks(site).env["HOROVOD_CYCLE_TIME"] == "0.25"


@pytest.mark.tensorflow
def test_bench_allreduce_sweeps_sizes_compares_horovod_with_mpi_and_records_the_knobs(run_ranks, tmp_path, repo):
    out = tmp_path / "ar.json"
    proc = run_ranks(2, ["bench", "allreduce", "--sweep", "--reps", "1", "--algorithms", "mpi,horovod",
                         "--json", str(out)], env={"HOROVOD_CYCLE_TIME": "0.5"}, timeout=240, cwd=repo)
    data = json.loads(out.read_text())
    sizes = [64 * 1024 * 4 ** k for k in range(6)]
    assert sorted({m["bytes"] for m in data["measurements"]}) == sizes     # 64 KiB .. 64 MiB
    assert data["horovod_knobs"] == {"HOROVOD_CYCLE_TIME": "0.5"}
    assert len(data["load_average"]) == 2 and data["cpus"] >= 1
    by = {(m["algorithm"], m["bytes"]): m for m in data["measurements"]}
    # every MPI size is timed before Horovod starts its background thread, which would disturb them
    assert [m["algorithm"] for m in data["measurements"]] == ["mpi"] * len(sizes) + ["horovod"] * len(sizes)
    pairs = data["horovod_vs_mpi"]
    assert [p["bytes"] for p in pairs] == sizes
    for p in pairs:   # the ratio is of the two medians in the same run
        assert p["mpi_s"] == by["mpi", p["bytes"]]["median_s"]
        assert p["horovod_s"] == by["horovod", p["bytes"]]["median_s"]
        assert p["percent_of_mpi"] == pytest.approx(100 * p["mpi_s"] / p["horovod_s"])
        # the graph call alone (no allreduce in it) is timed beside, and taken out of the second ratio
        assert p["graph_call_s"] == by["horovod", p["bytes"]]["graph_call_s"] > 0
        own = p["horovod_s"] - p["graph_call_s"]
        assert p["in_graph_percent_of_mpi"] == pytest.approx(100 * p["mpi_s"] / own if own > 0 else 0.0)
    assert all(m["graph_call_s"] == 0 for m in data["measurements"] if m["algorithm"] == "mpi")
    assert "Horovod % of MPI rate" in proc.stdout and "% without it" in proc.stdout
    assert "HOROVOD_CYCLE_TIME=0.5" in proc.stdout
    assert proc.stdout.count("%") >= 2 * len(sizes)
