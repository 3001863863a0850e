"""The provenance's versions: only the packages the runs used, and DIFFER only where runs of one kind differ (a
one-rank run has no process group, so it is not compared with runs of several ranks on that key)."""
from __future__ import annotations

from importlib import metadata

from firescale.report.provenance import RUN_PACKAGES, collect_provenance, provenance_lines

SITE = {"name": "local", "source": "site/local/site.yaml", "sha256": "0" * 64}
TORCH = {"firescale": "0.1.0", "python": "3.11.7", "numpy": "1.26.4", "torch": "2.13.0+cpu", "cuda": None,
         "cudnn": None, "nccl": None, "mpi": "mpirun (Open MPI) 4.1.4", "framework": "pytorch", "precision": "fp32",
         "hostname": "vm"}


def _installed(module: str) -> str | None:
    for name in RUN_PACKAGES[module]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _prov(records, tmp_path):
    prov = collect_provenance(records, site=SITE, repo=tmp_path, command=["firescale", "report"])
    lines = provenance_lines(prov)
    return prov, next(l for l in lines if l.startswith("versions in the runs")), \
        next(l for l in lines if l.startswith("versions making this report"))


def _torch(edited, point, process_group, **more):
    return edited(point, train={"versions": {**TORCH, "process_group": process_group, **more}})


def test_a_pytorch_sweep_names_no_tensorflow_and_its_one_rank_baseline_no_difference(edited, tmp_path):
    records = [_torch(edited, "baseline", "none"), _torch(edited, "g2-b64-r0", "gloo"),
               _torch(edited, "g2-b64-r1", "gloo")]
    prov, runs, here = _prov(records, tmp_path)
    assert "process_group gloo (several ranks), none (one rank)" in runs and "DIFFER" not in runs
    assert prov["versions_runs_by_ranks"] == {"process_group": {"several ranks": ["gloo"], "one rank": ["none"]}}
    assert "cuda" not in runs and "None" not in runs          # what the runs did not have is not listed
    every = " ".join(provenance_lines(prov))
    assert "tensorflow" not in every and "horovod" not in every and "not installed" not in every
    assert set(prov["versions_report"]) <= {"python", "firescale", "numpy", "matplotlib", "torch"}
    assert prov["versions_report"].get("torch") == _installed("torch")
    assert "matplotlib" in here


def test_runs_of_one_kind_that_differ_are_said_to(edited, tmp_path):
    records = [_torch(edited, "baseline", "none"), _torch(edited, "g2-b64-r0", "gloo"),
               _torch(edited, "g2-b64-r1", "mpi")]
    _, runs, _ = _prov(records, tmp_path)
    assert "process_group gloo / mpi (several ranks), none (one rank) (DIFFER between runs of several ranks)" in runs
    # a version is one kind across every run: the baseline's other numpy differs
    records = [_torch(edited, "baseline", "none", numpy="2.0.0"), _torch(edited, "g2-b64-r0", "gloo")]
    _, runs, _ = _prov(records, tmp_path)
    assert "numpy 1.26.4 / 2.0.0 (DIFFER between runs)" in runs


def test_a_tensorflow_sweep_names_its_framework_once_by_its_module(records, tmp_path):
    prov, runs, here = _prov(records, tmp_path)       # the fixture's Horovod runs: tensorflow 2.15.1, horovod 0.28.1
    assert "tensorflow 2.15.1" in runs and "torch" not in runs and "DIFFER" not in runs
    assert "tensorflow-cpu" not in here and "not installed" not in here and "torch" not in here
    assert prov["versions_report"].get("tensorflow") == _installed("tensorflow")
    assert prov["versions_report"].get("horovod") == _installed("horovod")
