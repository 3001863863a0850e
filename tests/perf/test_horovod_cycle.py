"""Horovod's negotiation cycle in the model: the wait before an allreduce, taken out of a probe, added per point.

The cases that matter are an iteration whose work (compute and allreduce, without the wait) is shorter
than a cycle, about a cycle, and longer (model/cycle.py)."""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
from site_helpers import site_copy  # noqa: E402

from firescale.bench.iteration_blocks import ITERATION_BLOCK, allreduce_costs
from firescale.cluster.horovod import DEFAULT_CYCLE_TIME_MS, site_cycle_time_s
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.model.cycle import allreduce_without_wait, cycle_wait
from firescale.model.layers import net_cost
from firescale.model.paleo import platform_from_site, predict_point
from firescale.nets.zoo import get_net
from firescale.predict.calibrate import allreduce_measurement, calibrate

MS = 1e-3


def test_an_iteration_shorter_than_a_cycle_is_one_cycle():
    # The next request is in before the next cycle starts: the iteration is the cycle, whatever it computes.
    assert cycle_wait(0.3 * MS, 1 * MS) == pytest.approx(0.7 * MS)
    assert cycle_wait(2.5 * MS, 8 * MS) == pytest.approx(5.5 * MS)
    for work in (0.1, 0.5, 0.9):
        assert work * MS + cycle_wait(work * MS, 1 * MS) == pytest.approx(1 * MS)


def test_about_a_cycle_the_request_moves_from_this_cycle_to_a_later_one():
    # Just short of a cycle, the wait is what remains of it; from a cycle on, the request falls at a
    # uniform phase of a later cycle and waits half a cycle on average.
    assert cycle_wait(0.999 * MS, 1 * MS) == pytest.approx(0.001 * MS)
    assert cycle_wait(1.0 * MS, 1 * MS) == pytest.approx(0.5 * MS)
    assert cycle_wait(1.001 * MS, 1 * MS) == pytest.approx(0.5 * MS)


def test_an_iteration_longer_than_a_cycle_waits_half_a_cycle():
    for work in (1.5, 2.4, 20.0, 900.0):
        assert cycle_wait(work * MS, 1 * MS) == pytest.approx(0.5 * MS)
    assert cycle_wait(30 * MS, 5 * MS) == pytest.approx(2.5 * MS)
    assert cycle_wait(5 * MS, 0.0) == 0.0                 # HOROVOD_CYCLE_TIME=0: the thread never sleeps


def test_the_wait_taken_out_of_a_measurement_is_the_one_the_model_adds():
    # A probe after a step of 1.4 ms that paid 0.4 ms of allreduce plus its wait measures 0.9 ms; the
    # allreduce's own 0.4 ms comes back, and adding the model's wait at the probe's step gives 0.9 again.
    own, determined = allreduce_without_wait(0.9 * MS, 1.4 * MS, 1 * MS)
    assert determined and own == pytest.approx(0.4 * MS)
    assert own + cycle_wait(1.4 * MS + own, 1 * MS) == pytest.approx(0.9 * MS)
    # Paced by the cycle (1 ms step, 8 ms cycle): any allreduce up to 7 ms measures 7 ms; not determined,
    # and what is taken lies in that range.
    own, determined = allreduce_without_wait(7.0 * MS, 1.0 * MS, 8 * MS)
    assert not determined and 0 <= own <= 7.0 * MS
    assert allreduce_without_wait(0.9 * MS, 1.4 * MS, 0.0) == (0.9 * MS, True)
    with pytest.raises(FirescaleError, match="the cycle time must be a number of seconds >= 0, not -1"):
        cycle_wait(1 * MS, -1)
    with pytest.raises(FirescaleError, match="the measured allreduce must be"):
        allreduce_without_wait(float("nan"), 1 * MS, 1 * MS)


def test_a_sites_cycle_time_is_its_knob_else_its_variable_else_horovods_default(tmp_path):
    assert DEFAULT_CYCLE_TIME_MS == 1.0
    assert site_cycle_time_s(load_site("local")) == pytest.approx(0.1 * MS)   # the shipped site's knob
    knob = load_site(site_copy(tmp_path / "k", "local", lambda d: d.update(horovod={"cycle_time_ms": 2.5})))
    assert site_cycle_time_s(knob) == pytest.approx(2.5 * MS)
    unset = load_site(site_copy(tmp_path / "u", "local", lambda d: d.pop("horovod")))
    assert site_cycle_time_s(unset) == pytest.approx(DEFAULT_CYCLE_TIME_MS * MS)

    def variable(value):
        def edit(d):
            d.pop("horovod")
            d["environment"]["variables"]["HOROVOD_CYCLE_TIME"] = value
        return edit

    assert site_cycle_time_s(load_site(site_copy(tmp_path / "v", "local", variable("4")))) == pytest.approx(4 * MS)

    def both(d):
        variable("4")(d)
        d["horovod"] = {"cycle_time_ms": 0.5}

    assert site_cycle_time_s(load_site(site_copy(tmp_path / "b", "local", both))) == pytest.approx(0.5 * MS)
    bad = load_site(site_copy(tmp_path / "bad", "local", variable("fast")))
    with pytest.raises(FirescaleError, match="site local: environment variable HOROVOD_CYCLE_TIME is 'fast'"):
        site_cycle_time_s(bad)


def test_a_multi_rank_point_adds_the_wait_for_the_sites_cycle_and_one_rank_none(tmp_path):
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    slow = load_site(site_copy(tmp_path / "slow", "local", lambda d: d.update(horovod={"cycle_time_ms": 8})))
    for site, cycle in ((load_site("local"), 0.1 * MS), (slow, 8 * MS)):
        platform = platform_from_site(site)
        assert platform.cycle_s == pytest.approx(cycle)
        one, two = predict_point(platform, spec, 1, 64), predict_point(platform, spec, 2, 64)
        assert one.cycle_wait_s == 0 and one.iteration_s == pytest.approx(one.forward_s + one.backward_s + one.update_s)
        work = two.forward_s + two.backward_s + two.update_s + two.comm_s
        assert two.cycle_wait_s == pytest.approx(cycle_wait(work, cycle))
        assert two.iteration_s == pytest.approx(work + two.cycle_wait_s)
    # LeNet on 8x8 digits computes in microseconds at the peak: on the slow site the iteration is the cycle.
    assert predict_point(platform_from_site(slow), spec, 2, 64).iteration_s == pytest.approx(8 * MS)


def _probe(path: Path, seconds: float, step: float, nbytes: int) -> str:
    """What `bench allreduce --algorithms horovod --compute-ms ... --json` writes (mean after a step)."""
    path.write_text(json.dumps({"measurements": [{"algorithm": "horovod", "ranks": 2, "bytes": nbytes,
                                                  "median_s": seconds + 0.5 * MS, "mean_s": seconds,
                                                  "compute_s": step}]}))
    return str(path)


def test_calibration_takes_the_probes_wait_out_and_each_point_gets_its_own(tmp_path):
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    platform = platform_from_site(load_site(site_copy(tmp_path / "one", "local",
                                                      lambda d: d.update(horovod={"cycle_time_ms": 1}))))
    nbytes = net_cost(spec, 1).weight_bytes
    t64, t32, step, paid = 3.8 * MS, 2.5 * MS, 2.4 * MS, 1.1 * MS
    probe = allreduce_measurement(_probe(tmp_path / "p.json", paid, step, nbytes), platform.algorithm, nbytes)
    assert probe["seconds"] == paid and probe["after_step_s"] == step      # the mean after a step
    cal = calibrate(platform, spec, 64, t64, probe, more_runs=[(32, t32)])
    src = cal.comm_source
    assert src["cycle_s"] == pytest.approx(1 * MS) and src["fitted"]
    assert src["allreduce_own_s"] == pytest.approx(paid - 0.5 * MS)
    assert src["cycle_wait_s"] == pytest.approx(0.5 * MS)
    model = cal.apply(platform)
    point = predict_point(model, spec, 2, 64)
    assert point.comm_s == pytest.approx(paid - 0.5 * MS, rel=1e-6)
    assert point.cycle_wait_s == pytest.approx(0.5 * MS)
    assert point.iteration_s == pytest.approx(t32 + paid, rel=1e-6)          # at the probe's step: as measured
    # With an 8 ms cycle the same net's 2-rank iterations are paced by it, whatever their batch.
    slow = platform_from_site(load_site(site_copy(tmp_path, "local",
                                                  lambda d: d.update(horovod={"cycle_time_ms": 8}))))
    probe = allreduce_measurement(_probe(tmp_path / "s.json", 8 * MS - 1.0 * MS, 1.0 * MS, nbytes),
                                  slow.algorithm, nbytes)
    cal = calibrate(slow, spec, 64, t64, probe, more_runs=[(32, t32)])
    assert not cal.comm_source["fitted"] and cal.ppp_comm == slow.link.ppp     # a bound, not a measurement
    assert cal.comm_source["allreduce_at_most_s"] == pytest.approx(7 * MS)
    assert "ran at one per Horovod cycle (8 ms)" in cal.comm_source["why"]
    model = cal.apply(slow)
    for batch in (64, 128):
        assert predict_point(model, spec, 2, batch).iteration_s == pytest.approx(8 * MS)
    # An MPI benchmark has no Horovod cycle in it: nothing is taken out, the point still waits.
    mpi = {"algorithm": "tree", "measured": "mpi", "bytes": nbytes, "ranks": 2, "seconds": 0.3 * MS}
    cal = calibrate(platform, spec, 64, t64, mpi, more_runs=[(32, t32)])
    assert "cycle_wait_s" not in cal.comm_source
    point = predict_point(cal.apply(platform), spec, 2, 64)
    assert point.comm_s == pytest.approx(0.3 * MS, rel=1e-6) and point.cycle_wait_s == pytest.approx(0.5 * MS)


class _ScriptedRuns:
    """A stand-in for TrainRuns (the real runs are `bench predict`'s): iteration times by (ranks, batch), in order."""

    overlap_allreduce = False

    def __init__(self, times: dict[tuple[int, int], list[float]]):
        self.times = {k: list(v) for k, v in times.items()}

    def run(self, ranks: int, total_batch: int, name: str):
        from firescale.predict.measurements import MeasuredIteration
        t = self.times[(ranks, total_batch)].pop(0)
        return MeasuredIteration(name, "lenet_same", "digits", ranks, total_batch // ranks, t, 0.0, t, 0.0, 400)


def test_the_check_probes_once_a_round_and_takes_the_fastest_probe(tmp_path):
    # A probe's mean moves by a third between runs as much as the trainer's does (the phase of the cycle):
    # the check probes in every round, after that round's calibration, and fits the least disturbed probe,
    # as it takes the fastest calibration runs.
    from firescale.predict.validation import prediction_check
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    platform = platform_from_site(load_site("local"))
    nbytes = net_cost(spec, 1).weight_bytes
    runs = _ScriptedRuns({(1, 64): [3.9 * MS, 3.8 * MS, 3.85 * MS] * 2, (1, 32): [2.6 * MS, 2.5 * MS, 2.55 * MS],
                          (2, 64): [3.7 * MS, 3.6 * MS, 3.65 * MS]})
    steps: list[float] = []
    paid = iter([1.4 * MS, 1.1 * MS, 1.3 * MS])

    def probe(step_s: float) -> dict:
        steps.append(step_s)
        path = _probe(tmp_path / f"p{len(steps)}.json", next(paid), step_s, nbytes)
        return allreduce_measurement(path, platform.algorithm, nbytes)

    cal, rows = prediction_check(runs, spec, platform, 64, [1, 2], 3, probe=probe)
    assert steps == pytest.approx([2.6 * MS, 2.5 * MS, 2.5 * MS])          # the fastest small run so far
    assert cal.comm_source["seconds"] == pytest.approx(1.1 * MS)
    two = next(r for r in rows if r.ranks == 2)
    assert two.predicted_s == pytest.approx(2.5 * MS + 1.1 * MS, rel=1e-6)  # at the probe's step: as probed



def test_the_check_measures_contention_once_a_round_and_scales_the_compute_by_the_median(tmp_path):
    # As the workflow calibrates a site whose ranks share a node: each round's small-batch run is started
    # again on every core at once; the median slowdown scales the compute of the points of several ranks.
    from firescale.predict.validation import prediction_check
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    platform = platform_from_site(load_site("local"))
    nbytes = net_cost(spec, 1).weight_bytes
    times = {(1, 64): [3.9 * MS, 3.8 * MS, 3.85 * MS] * 2, (1, 32): [2.6 * MS, 2.5 * MS, 2.55 * MS],
             (2, 64): [3.7 * MS, 3.6 * MS, 3.65 * MS]}

    def probe(step_s: float) -> dict:
        return allreduce_measurement(_probe(tmp_path / "p.json", 1.1 * MS, step_s, nbytes), platform.algorithm, nbytes)

    alone: list[float] = []
    factors = iter([1.30, 1.10, 1.20])

    def contend(m) -> list[dict]:
        alone.append(m.iteration_s)
        return [{"factor": next(factors), "copies": 2, "nodes": 1}]

    cal, rows = prediction_check(_ScriptedRuns(times), spec, platform, 64, [1, 2], 3, probe=probe, contend=contend)
    plain, plain_rows = prediction_check(_ScriptedRuns(times), spec, platform, 64, [1, 2], 3, probe=probe)
    assert alone == pytest.approx([2.6 * MS, 2.5 * MS, 2.55 * MS])     # each round's own small-batch run
    assert cal.contention == pytest.approx(1.20) and plain.contention == 1.0
    assert [r["factor"] for r in cal.compute_source["contention"]["rounds"]] == [1.30, 1.10, 1.20]
    (one, two), (plain_one, plain_two) = rows, plain_rows
    assert one.predicted_s == pytest.approx(plain_one.predicted_s)      # one rank computes alone
    # the 2-rank point's compute and fixed overhead, 2.5 ms at 32 images (the fit), 1.2 times as long
    assert two.predicted_s - plain_two.predicted_s == pytest.approx(0.2 * 2.5 * MS, rel=1e-6)
    assert cal.contention_across == ()
    # A site of one rank a node: the 2-rank point spans 2 nodes, and the copies on both at once (each round's
    # second measurement) decide its compute, by their own median.
    spread = replace(platform, links=replace(platform.links, ranks_per_node=1))
    factors = iter([1.30, 1.50, 1.10, 1.40, 1.20, 1.45])

    def contend_across(m) -> list[dict]:
        return [{"factor": next(factors), "copies": 2, "nodes": n} for n in (1, 2)]

    cal, (_, two) = prediction_check(_ScriptedRuns(times), spec, spread, 64, [1, 2], 3, probe=probe,
                                     contend=contend_across)
    _, (_, plain_two) = prediction_check(_ScriptedRuns(times), spec, spread, 64, [1, 2], 3, probe=probe)
    assert cal.contention == pytest.approx(1.20) and cal.contention_across == ((2, pytest.approx(1.45)),)
    assert [r["factor"] for r in cal.compute_source["contention_across"][0]["rounds"]] == [1.50, 1.40, 1.45]
    assert two.predicted_s - plain_two.predicted_s == pytest.approx(0.45 * 2.5 * MS, rel=1e-6)

def test_the_probe_counts_the_ranks_mean_iteration_not_each_repetitions_slowest_rank():
    # Two ranks in step over a block: each spends 3.6 ms on two repetitions, split differently (where one
    # repetition ends depends on when the rank's thread wakes).  The loop runs at 1.8 ms an iteration, 0.6 ms
    # more than the 1.2 ms step; the slowest rank per repetition would say 0.8 ms.
    reps = ITERATION_BLOCK
    with_t = np.array([[2.0e-3, 1.6e-3] * (reps // 2), [1.6e-3, 2.0e-3] * (reps // 2)])
    without_t = np.array([[1.2e-3], [1.2e-3]])
    seconds, steps = allreduce_costs(with_t, without_t)
    assert steps == [pytest.approx(1.2e-3)]
    assert seconds == [pytest.approx(0.6e-3)] * reps
    assert statistics.fmean(seconds) == pytest.approx(with_t.sum(axis=1).mean() / reps - 1.2e-3)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_bench_predict_on_local_measures_the_contention_and_predicts_with_it(tmp_path, repo, digits_dataset):
    # The command end to end on real ranks: the round's contention run (one copy on each core at once) is
    # kept, its factor is the calibration's, and the 2-rank prediction is the model's with it.
    from cli import run_firescale
    from firescale.predict.calibrate import load_calibration
    out, work = tmp_path / "check.json", tmp_path / "runs"
    proc = run_firescale("bench", "predict", "--dataset", digits_dataset, "--solver",
                         "workflow/solvers/lenet-digits-b8.yaml", "--batch", "8", "--iterations", "20",
                         "--repeats", "1", "--workdir", work, "--json", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (round_,) = data["calibration"]["compute_source"]["contention"]["rounds"]
    assert round_["copies"] == 2 and round_["batch"] == 4 and len(round_["loaded_s"]) == 2
    assert round_["ratio"] == pytest.approx(statistics.median(round_["loaded_s"]) / round_["alone_s"])
    assert data["calibration"]["contention"] == round_["factor"] == max(1.0, round_["ratio"])
    assert sorted(p.name for p in (work / "contention-round-0").iterdir()) == ["contention-b4-0", "contention-b4-1"]
    (work / "cal.json").write_text(json.dumps(data["calibration"]))
    model = load_calibration(work / "cal.json").apply(platform_from_site(load_site("local")))
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    one, two = data["rows"]
    assert two["predicted_s"] == pytest.approx(predict_point(model, spec, 2, 8).iteration_s, rel=1e-9)
    assert one["predicted_s"] == pytest.approx(predict_point(model, spec, 1, 8).iteration_s, rel=1e-9)
    assert "contention: compute of 2 ranks on one node at once scaled by" in proc.stdout
