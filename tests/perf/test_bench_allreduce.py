"""`firescale bench allreduce` over real MPI ranks: correct sums, and the parameter server's growth with p."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_parameter_server_cost_grows_with_ranks(run_ranks, tmp_path, repo):
    medians = {}
    for p in (2, 4):
        out = tmp_path / f"ar{p}.json"
        proc = run_ranks(p, ["bench", "allreduce", "--sizes-mb", "8", "--reps", "3", "--algorithms",
                             "ps,tree,ring,mpi", "--bandwidth-gbits", "40", "--latency-us", "1",
                             "--json", str(out)], timeout=240, cwd=repo)
        assert "meas/pred" in proc.stdout
        data = json.loads(out.read_text())
        assert data["ranks"] == p
        # every algorithm's sum was checked on every rank inside the benchmark
        runs = {m["algorithm"]: m for m in data["measurements"]}
        assert set(runs) == {"ps", "tree", "ring", "mpi"}
        assert all(m["min_s"] > 0 and m["predicted_s"] > 0 for m in runs.values())
        medians[p] = {a: m["min_s"] for a, m in runs.items()}
    # The root receives p-1 gradients and sends p-1: 3x the traffic at 4 ranks as at 2.
    assert medians[4]["ps"] > 1.5 * medians[2]["ps"]
