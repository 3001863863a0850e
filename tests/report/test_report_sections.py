"""The LR-search table with the chosen rate, and every hyperparameter, in every format of the report."""
from __future__ import annotations

import copy

from report_records import raw_record

from firescale.report.sections import beyond_ideal_section, chosen_rate, hyperparameter_section, lr_search_sections
from firescale.report.summary import summarize
from firescale.report.tables import to_json, to_latex, to_markdown
from firescale.sweep.records import run_record_from_dict

SOLVER = {"type": "SGD", "base_lr": 0.01, "lr_policy": "poly", "power": 0.5, "momentum": 0.9,
          "weight_decay": 0.0002, "regularization_type": "L2", "max_iter": 2400, "clip_gradients": -1.0,
          "ignored": {"net": "models/bvlc_googlenet/train_val.prototxt", "solver_mode": "GPU"}}


def _record(point: str, gpus: int, batch: int, lr: float, top1: float, wall: float, outcome: str = "succeeded"):
    data = copy.deepcopy(raw_record("g2-b64-r0" if point != "baseline" else "baseline"))
    data.update(point=point, gpus=gpus, nodes=gpus, batch=batch, lr=lr, repeat=0, outcome=outcome)
    if outcome != "succeeded":
        data.update(train=None, reason="the training loss became nan at iteration 12; lower base_lr")
        return run_record_from_dict(data, point)
    data["train"].update(solver={**SOLVER, "base_lr": lr, "max_iter": 2400 * 32 // batch},
                         batch={"batch_per_rank": batch // gpus, "iter_size": 1, "warmup_iters": 0},
                         evals=[{"iter": 10, "epoch": 36.0, "wall_s": wall / 2, "top1": top1 - 0.02, "top5": 0.9,
                                 "loss": 1.0},
                                {"iter": 20, "epoch": 72.0, "wall_s": wall, "top1": top1, "top5": 0.95, "loss": 0.5}],
                         train_time_s=wall, target_top1=None, reached_target=False, time_to_accuracy_s=None)
    return run_record_from_dict(data, point)


def _search():
    return [_record("baseline", 1, 32, 0.01, 0.683, 1000.0),
            _record("g32-b1024-lr0.02-r0", 32, 1024, 0.02, 0.661, 60.0),
            _record("g32-b1024-lr0.04-r0", 32, 1024, 0.04, 0.672, 55.0),
            _record("g32-b1024-lr0.08-r0", 32, 1024, 0.08, 0.683, 50.0),
            _record("g32-b1024-lr0.16-r0", 32, 1024, 0.16, 0.680, 45.0),
            _record("g32-b1024-lr0.32-r0", 32, 1024, 0.32, 0.0, 0.0, outcome="failed"),
            _record("g128-b1024-lr0.08-r0", 128, 1024, 0.08, 0.683, 20.0)]


def test_the_fastest_rate_that_matches_the_baseline_is_chosen():
    summary = summarize(_search(), 0.005)
    [section] = lr_search_sections(summary)
    assert section.title == "Learning-rate search: 32 GPUs, batch 1024"
    assert [row[0] for row in section.rows] == ["0.02", "0.04", "0.08", "0.16", "0.32"]
    by_rate = {row[0]: row for row in section.rows}
    assert by_rate["0.02"][1:3] == ["66.1%", "95.0%"] and by_rate["0.02"][6].startswith("BELOW BASELINE")
    # 0.08 and 0.16 both match (0.16 within the 0.5-point tolerance); 0.16 gets there first
    assert by_rate["0.16"][7] == "◀ chosen" and by_rate["0.08"][7] == ""
    assert section.marked == [False, False, False, True, False]
    assert by_rate["0.32"][3] == "FAILED" and "loss became nan" in by_rate["0.32"][6]
    assert section.notes[0] == "Chosen: LR 0.16, the rate that matches the baseline and reaches the target first."
    rows = [r for r in summary.rows if r.gpus == 32]
    assert chosen_rate(rows).lr == 0.16
    assert chosen_rate([r for r in rows if r.lr < 0.05]) is None


def test_every_hyperparameter_is_reported_common_ones_once():
    summary = summarize(_search(), 0.005)
    section = hyperparameter_section(summary)
    assert section.heads == ["Point", "Batch per GPU", "max_iter"]
    assert section.rows[0] == ["baseline", "32", "2400"] and section.rows[1] == ["g32-b1024-lr0.02", "32", "75"]
    common = section.notes[0]
    for text in ("LR policy: poly (power 0.5)", "Solver: SGD", "Momentum: 0.9", "Weight decay: 0.0002 (L2)",
                 "Warm-up: none", "Initialisation: xavier weights, zero biases (Caffe LeNet)",
                 "Solver keys ignored: net, solver_mode", "iter_size: 1", "Seeds: 1"):
        assert text in common, text


def test_the_sections_appear_in_markdown_latex_and_json(ctx):
    summary = summarize(_search(), 0.005)
    md = to_markdown(summary, ctx, [])
    assert "## Learning-rate search: 32 GPUs, batch 1024" in md and "| 0.16 | 68.0% |" in md and "◀ chosen" in md
    assert "## Hyperparameters" in md and "| g128-b1024-lr0.08 | 8 | 75 |" in md
    tex = to_latex(summary, ctx, [])
    # the main table, its second (intervals), time beyond the ideal, the search and the hyperparameters
    assert tex.count(r"\begin{table}") == 5 and r"\caption{Learning-rate search: 32 GPUs, batch 1024}" in tex
    data = to_json(summary, ctx)
    assert [s["title"] for s in data["sections"]] == ["Time beyond the ideal",
                                                     "Learning-rate search: 32 GPUs, batch 1024", "Hyperparameters"]


def _timed(point: str, gpus: int, batch: int, iterations: int, split_ms: tuple[float, float, float], eval_s: float,
           rest_s: float):
    """A run whose train time is its iterations (data wait, compute, allreduce in ms), evaluation and the rest."""
    wait, compute, allreduce = (ms / 1e3 for ms in split_ms)
    data = copy.deepcopy(raw_record("g2-b64-r0" if point != "baseline" else "baseline"))
    train_s = iterations * (wait + compute + allreduce) + eval_s + rest_s
    data.update(point=point, gpus=gpus, nodes=1, batch=batch, repeat=0)
    data["train"].update(iterations=iterations, train_time_s=train_s, epochs=1.0,
                         per_iteration={"data_wait_s": wait, "compute_s": compute, "allreduce_s": allreduce,
                                        "iterations": iterations},
                         segments=[{**data["train"]["segments"][0], "train_s": train_s, "eval_s": eval_s}])
    data["train"]["evals"][-1]["wall_s"] = train_s
    return run_record_from_dict(data, point)


def test_the_time_beyond_the_ideal_is_split_into_parts_that_add_up():
    # The baseline: 400 iterations of 0.1 + 80 + 0.4 ms, 6 s evaluating, 0.2 s else: 38.4 s.  The 2-GPU point
    # trains the same epoch in 200 iterations of 0.2 + 100 + 15 ms, 4 s evaluating, 0.1 s else: 27.14 s.
    # Ideal 38.4 / 2 = 19.2 s; beyond it 7.94 s = compute 200 x 100 ms - 400 x 80 ms / 2 = 4.0 s, allreduce
    # 3.0 - 0.08 = 2.92 s, data wait 0.04 - 0.02 = 0.02 s, evaluation 4 - 3 = 1.0 s and the rest 0.1 - 0.1 = 0.
    summary = summarize([_timed("baseline", 1, 64, 400, (0.1, 80.0, 0.4), 6.0, 0.2),
                         _timed("g2-b128-r0", 2, 128, 200, (0.2, 100.0, 15.0), 4.0, 0.1)], 0.01)
    section = beyond_ideal_section(summary)
    assert section.heads == ["Point", "Ideal", "Train time", "Beyond ideal", "Compute", "Allreduce", "Data wait",
                             "Evaluation", "The rest"]
    assert section.rows == [["g2-b128", "19.2 s", "27.1 s", "+7.9 s (100%)", "+4.0 s (50%)", "+2.9 s (37%)",
                             "+20 ms (0%)", "+1.0 s (13%)", "+0 ms (0%)"]]


def test_no_time_beyond_the_ideal_without_a_baseline_or_a_point_on_several_gpus():
    baseline = _timed("baseline", 1, 64, 400, (0.1, 80.0, 0.4), 6.0, 0.2)
    assert beyond_ideal_section(summarize([baseline], 0.01)) is None
    assert beyond_ideal_section(summarize([_timed("g2-b128-r0", 2, 128, 200, (0.2, 100.0, 15.0), 4.0, 0.1)],
                                          0.01)) is None
