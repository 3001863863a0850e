"""The calibration tests' project: an experiments file of LeNet on the digits, its solver, and the baseline's
result as `firescale train` writes it."""
from __future__ import annotations

from pathlib import Path

import yaml

from firescale.results import EvalPoint, IterationSplit, Segment, TrainResult, write_result
from firescale.sweep.jobs import run_dir
from firescale.sweep.plan import SweepPlan

EXPERIMENT = "digits-cal"
SOLVER = ("type: SGD\nbase_lr: 0.01\nlr_policy: fixed\nmomentum: 0.9\nmax_iter: 60\ntest_interval: 30\n"
          "display: 30\nsnapshot: 100\nrandom_seed: 1\n")
# as the TensorFlow backend records them (train/tensorflow/distributed.versions) on this machine
VERSIONS = {"firescale": "0.1.0", "python": "3.11.7", "tensorflow": "2.15.1", "numpy": "1.26.4",
            "horovod": "0.28.1", "mpi": "mpirun (Open MPI) 4.1.4", "hostname": "vm", "commit": "cbfa7a0bbd4e"}


def experiments(**changes) -> dict:
    """The experiments file: LeNet on the digits, the baseline at batch 64 and one point of 1 GPU at 32."""
    exp = {"net": "lenet_same", "dataset": {"name": "digits", "source": "digits"}, "solver": "short.yaml",
           "batch": {"mode": "total", "baseline": 64}, "repeats": 1, "walltime": "00:10:00",
           "sweep": {"gpus": [1], "batch": [32]}, "sites": {"local": None}, **changes}
    return {"site": "local", "experiments": {EXPERIMENT: exp}}


def write_experiments(project: Path, config: dict) -> Path:
    path = project / "workflow" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def baseline_result(plan: SweepPlan, versions: dict[str, str]) -> Path:
    """The baseline's result.json in its run folder, as `firescale train` writes it."""
    third = 0.004
    result = TrainResult(
        net="lenet_same", dataset=str(plan.dataset_dir(EXPERIMENT)), dataset_manifest_sha256="", ranks=1,
        solver={"type": "SGD"}, batch={"ranks": 1, "batch_per_rank": 64, "total_batch": 64, "iter_size": 1,
                                       "effective_batch": 64},
        seed=1, data_seed=1, target_top1=None, target_source="none", reached_target=False, time_to_accuracy_s=None,
        train_time_s=1.0, iterations=60, epochs=2.7, images_per_s=5000.0,
        per_iteration=IterationSplit(third, third, third, 60), allreduce={}, hostnames=["vm"], versions=versions,
        evals=[EvalPoint(60, 2.7, 1.0, 0.9, 1.0, 0.3)], segments=[Segment(0, 60, 1.0, 1.0, 0.0, 3840, "finished")],
        status="finished")
    out = run_dir(plan, EXPERIMENT, plan.baselines(EXPERIMENT)[0]) / "result.json"
    write_result(out, result)
    return out
