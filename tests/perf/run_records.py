"""Run records and trainer results as `firescale train` and `sweep run` write them, for the calibration tests."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from firescale.results import EvalPoint, IterationSplit, Segment, TrainResult


def train_result(batch_per_rank: int, iteration_ms: float, ranks: int = 1, **changes: Any) -> dict:
    """A trainer result as `firescale train` writes it (the fields results.TrainResult defines), its iteration
    split in three equal parts; `changes` replaces any field."""
    third = iteration_ms / 3e3
    return replace(TrainResult(
        net="lenet_same", dataset="/nonexistent/digits", dataset_manifest_sha256="", ranks=ranks,
        solver={"type": "SGD"},
        batch={"ranks": ranks, "batch_per_rank": batch_per_rank, "total_batch": batch_per_rank * ranks,
               "iter_size": 1, "effective_batch": batch_per_rank * ranks},
        seed=1, data_seed=1, target_top1=None, target_source="none", reached_target=False, time_to_accuracy_s=None,
        train_time_s=1.0, iterations=300, epochs=10.0, images_per_s=1000.0,
        per_iteration=IterationSplit(third, third, third, 300), allreduce={}, hostnames=["vm"], versions={},
        evals=[EvalPoint(300, 10.0, 1.0, 0.9, 1.0, 0.3)], segments=[Segment(0, 300, 1.0, 1.0, 0.0, 1, "finished")],
        status="finished", command=["firescale", "train", "--dataset", "/nonexistent/digits", "--net", "lenet_same",
                                    "--solver", "s.yaml", "--out", "/x", "--total-batch", "64", "--resume"],
    ), **changes).to_dict()


def run_record(train: dict | None, outcome: str = "succeeded") -> dict:
    """A sweep point's run record (firescale.sweep.run/1) around a trainer result."""
    return {"format": "firescale.sweep.run/1", "site": "local", "experiment": "digits-lenet", "point": "baseline",
            "gpus": 1, "nodes": 1, "batch": 64, "lr": 0.05, "repeat": 0, "baseline": True, "outcome": outcome,
            "reason": "", "log_tail": "", "queue_s": 0.0, "submissions": [], "train": train, "status": None}
