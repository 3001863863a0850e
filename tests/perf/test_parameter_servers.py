"""The two parameter-server models under their own names: Paleo's OneToAll (`ps`) and FireCaffe's Eq. 3."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from firescale.model.comm import ALGORITHM_NAMES, COST_MODELS, Link, allreduce_time, canonical_algorithm

MB30 = 30e6                 # NiN's |W|, FireCaffe's Figure 4
BW = 70e9 / 8               # Titan's Gemini link, 70 Gbit/s


def test_paleo_onetoall_is_ps_and_firecaffe_eq3_is_its_own_model():
    link = Link(BW)
    for p in (2, 8, 32, 128):
        # Paleo's OneToAll: 2KT, the master talking to its K = p-1 workers one at a time, both ways
        assert allreduce_time("ps", MB30, p, link) == pytest.approx(2 * (p - 1) * MB30 / BW)
        # FireCaffe's Eq. 3: |grad W| * p / BW
        assert allreduce_time("firecaffe-ps", MB30, p, link) == pytest.approx(p * MB30 / BW)
    # the two differ: at 2 ranks Eq. 3 is OneToAll itself, at 32 a little over half of it
    assert allreduce_time("firecaffe-ps", MB30, 32, link) / allreduce_time("ps", MB30, 32, link) == \
        pytest.approx(32 / 62)


def test_latency_and_reduction_terms_of_eq3():
    link = Link(BW, latency=5e-6, reduce_rate=1e9)
    assert allreduce_time("firecaffe-ps", MB30, 4, link) == pytest.approx(4 * (5e-6 + MB30 / BW) + 3 * MB30 / 1e9)
    assert allreduce_time("firecaffe-ps", MB30, 1, link) == 0.0       # one rank needs no server


def test_old_names_keep_meaning_onetoall_and_eq3_has_aliases():
    for name in ("ps", "parameter_server", "onetoall", "OneToAll", "one-to-all"):
        assert canonical_algorithm(name) == "ps", name
    for name in ("firecaffe-ps", "firecaffe_ps", "firecaffe_eq3", "FireCaffe-Eq3"):
        assert canonical_algorithm(name) == "firecaffe-ps", name
    assert "firecaffe-ps" in COST_MODELS
    assert "OneToAll" in ALGORITHM_NAMES["ps"] and "Eq. 3" not in ALGORITHM_NAMES["ps"]
    assert "FireCaffe Eq. 3" in ALGORITHM_NAMES["firecaffe-ps"]


def test_predict_names_the_parameter_server_it_models(repo, tmp_path):
    for name, label in (("parameter_server", "allreduce ps [parameter server, one message at a time (Paleo's "
                                             "OneToAll, 2(p-1)|W|/BW)]"),
                        ("firecaffe_eq3", "allreduce firecaffe-ps [parameter server, sends beside receives "
                                          "(FireCaffe Eq. 3, p|W|/BW)]")):
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "sweep", "--net", "nin", "--gpus", "1,32",
                               "--batch", "256", "--peak-tflops", "3.9", "--memory-gbs", "250",
                               "--bandwidth-gbits", "70", "--algorithm", name, "--json", str(out)],
                              capture_output=True, text=True, cwd=repo, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert label in proc.stdout, proc.stdout
        rows = json.loads(out.read_text())["points"]
        model = canonical_algorithm(name)
        assert {r["algorithm"] for r in rows} == {model}
        by_gpus = {r["gpus"]: r for r in rows}
        assert by_gpus[32]["comm_s"] == pytest.approx(allreduce_time(model, by_gpus[32]["gradient_bytes"], 32,
                                                                     Link(70e9 / 8)))


def test_bench_allreduce_sets_the_parameter_server_beside_both_models(run_ranks, tmp_path, repo):
    out = tmp_path / "ps.json"
    proc = run_ranks(3, ["bench", "allreduce", "--sizes-mb", "1", "--reps", "2", "--algorithms", "ps,tree",
                         "--bandwidth-gbits", "40", "--latency-us", "1", "--json", str(out)], timeout=240, cwd=repo)
    runs = {m["algorithm"]: m for m in json.loads(out.read_text())["measurements"]}
    link = Link(40e9 / 8, 1e-6)
    ps = runs["ps"]["predicted_by_model"]
    assert set(ps) == {"ps", "firecaffe-ps"} and set(runs["tree"]["predicted_by_model"]) == {"tree"}
    assert ps["ps"] == pytest.approx(allreduce_time("ps", 1e6, 3, link)) == runs["ps"]["predicted_s"]
    assert ps["firecaffe-ps"] == pytest.approx(allreduce_time("firecaffe-ps", 1e6, 3, link))
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("ps ")]
    assert [row[5] for row in rows] == ["ps", "firecaffe-ps"], proc.stdout
