"""`predict calibrate` without its command line (predict/calibration_run.py): a request's options refused by name
before anything runs or is written, the net and its shape taken from the records, the fit stored and said."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from run_records import run_record, train_result

from firescale.cluster import ranks
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.model.comm import Link
from firescale.model.paleo import Device, Platform
from firescale.predict import calibration_run
from firescale.predict.calibrate import load_calibration
from firescale.predict.calibration_run import (
    CalibrationRequest,
    in_rounds,
    measuring_site,
    net_shape,
    run_calibration,
)
from firescale.predict.measurements import MeasuredIteration
from firescale.train.options import record_options

# test_overhead_calibration's machine: 76.8 GFLOP/s and 10 GB/s, slow enough for LeNet's runs below
PLATFORM = Platform("local", Device("cpu", 7.68e10, 1e10), Link(5e9, 5e-7), "tree")
NUMBERS = CalibrationRequest(batch=64, iteration_s=0.03, net="lenet_same", input_shape=(8, 8, 1), classes=10)


@pytest.mark.parametrize("changes, message", [
    ({"probe_rounds": 0}, "--probe-rounds must be 1 or more, not 0"),
    ({"contention_rounds": 0}, "--contention-rounds must be 1 or more, not 0"),
    ({"short_runs": -1}, "--short-runs must be 1 or more, not -1"),
    ({"run_timeout": 0.0}, "--run-timeout must be more than 0 seconds, not 0"),
    ({"probe_timeout": float("nan")}, "--probe-timeout must be more than 0 seconds, not nan"),
    ({"io_format": "lmdb"}, "--io-format picks a format of --io-record: give --io-record too"),
    ({"io_format": "lmdb", "probe_rounds": 0}, "--io-format picks a format of --io-record"),   # the record first
    ({"iteration_s": None}, "--batch and --iteration-s go together"),
    ({"batch": None, "iteration_s": None},
     "give a single-rank run: --record RESULT.json, or --batch with --iteration-s"),
    ({"net": None}, "give --net (no run record names the network)"),
    ({"probe_overlap": True}, "--probe-overlap times the allreduce probe beside its step: give --allreduce-probe too"),
    ({"allreduce_json": "a.json", "comm_record": "b.json"},
     "give one of --allreduce-json, --comm-record and --allreduce-probe"),
    ({"allreduce_probe": 2}, "--allreduce-probe starts ranks as a site does: give --site"),
    ({"short_run": 50}, "--short-run repeats a recorded run: give its --record"),
    ({"out": None}, "give --out, or --site so that the calibration goes to the site's results"),
])
def test_a_bad_request_is_refused_by_its_options_name_and_nothing_is_written(tmp_path, changes, message):
    out = tmp_path / "calibration.json"
    said: list[str] = []
    with pytest.raises(FirescaleError, match=re.escape(message)):
        run_calibration(replace(NUMBERS, **{"out": str(out), **changes}), PLATFORM, None, say=said.append)
    assert not out.exists() and said == []


TRAIN_COMMAND = train_result(64, 11.7)["command"]
# Files the requests below name: records as `sweep run` and `firescale train` write them, and a bad bench file.
NAMED = {"base.json": run_record(train_result(64, 11.7)),
         "nameless.json": run_record(train_result(64, 11.7, net="")),            # a record naming no net
         "uncommanded.json": run_record(train_result(64, 11.7, command=[])),     # nothing to repeat
         "lenet-2.json": train_result(32, 10.5, ranks=2, net="lenet"),          # a run of another net
         "torch.json": run_record(train_result(64, 11.7, command=[*TRAIN_COMMAND, "--framework", "pytorch"])),
         "bench.json": {"measurements": "none"}}                                 # no bench allreduce record


@pytest.mark.parametrize("changes, message", [
    ({"batch": 64}, "--batch and --iteration-s go together"),
    ({"iteration_s": 0.03}, "--batch and --iteration-s go together"),
    ({"allreduce_probe": None, "probe_overlap": True},
     "--probe-overlap times the allreduce probe beside its step: give --allreduce-probe too"),
    ({"allreduce_json": "bench.json"}, "give one of --allreduce-json, --comm-record and --allreduce-probe"),
    ({"comm_record": "lenet-2.json"}, "give one of --allreduce-json, --comm-record and --allreduce-probe"),
    ({"records": ("nameless.json",)}, "give --net (no run record names the network)"),
    ({"out": None, "allreduce_probe": None, "site": None},
     "give --out, or --site so that the calibration goes to the site's results"),
    # the files named are read before anything runs too
    ({"allreduce_probe": None, "comm_record": "lenet-2.json"}, "net 'lenet' is not the calibrated 'lenet_same'"),
    ({"allreduce_probe": None, "allreduce_json": "bench.json"},
     "bench.json: not a `firescale bench allreduce --json` record"),
    ({"records": ("uncommanded.json",)},
     "uncommanded.json: the run record keeps neither its options nor a `firescale train` command line to repeat"),
    # the probe's backend: --framework, else the record's
    ({"framework": "caffe2"}, "--framework 'caffe2' is not a framework firescale trains with"),
    ({"records": ("torch.json",), "probe_overlap": True},
     "--probe-overlap times Horovod's allreduce beside the step's backward pass; the pytorch trainer's "
     "(torch.distributed's) is probed on its own"),
    ({"framework": "pytorch", "probe_overlap": True}, "the pytorch trainer's (torch.distributed's) is probed"),
])
def test_a_bad_request_is_refused_before_any_short_run_round_or_probe_starts(tmp_path, monkeypatch, changes,
                                                                               message):
    """A request that would run the record's trainer again, its copies for the contention and the allreduce
    probe on this machine is refused by its options, and by the files it names, before any of them starts."""
    for name, content in NAMED.items():
        (tmp_path / name).write_text(json.dumps(content))
    named = {key: str(tmp_path / value) for key, value in changes.items() if key in ("allreduce_json", "comm_record")}
    records = tuple(str(tmp_path / name) for name in changes.get("records", ("base.json",)))
    request = CalibrationRequest(records=records, short_run=50, allreduce_probe=2,
                                 out=str(tmp_path / "calibration.json"))
    request = replace(request, **{**{key: value for key, value in changes.items() if key not in ("records", "site")},
                                  **named})
    _refused_before_measuring(monkeypatch, request, changes.get("site", load_site("local")), message)


def test_the_probe_times_the_allreduce_of_the_records_backend_unless_framework_says_otherwise(tmp_path):
    from firescale.predict.calibration_run import probe_framework
    from firescale.predict.measurements import read_measured_iteration

    for name in ("base.json", "torch.json"):
        (tmp_path / name).write_text(json.dumps(NAMED[name]))
    tf, torch = (read_measured_iteration(str(tmp_path / n)) for n in ("base.json", "torch.json"))
    assert probe_framework(CalibrationRequest(), [tf]) == "tensorflow"           # the trainer's default
    assert probe_framework(CalibrationRequest(), [torch, tf]) == "pytorch"       # the first record's
    assert probe_framework(CalibrationRequest(framework="tensorflow"), [torch]) == "tensorflow"
    assert probe_framework(CalibrationRequest(framework="pytorch"), []) == "pytorch"
    assert probe_framework(NUMBERS, []) == "tensorflow"                          # numbers alone: the default
    # the record's options say its framework, whatever its command line (records before them: the line's)
    kept = replace(tf, options={**record_options(tf.train_options()), "framework": "pytorch"})
    assert probe_framework(CalibrationRequest(), [kept]) == "pytorch"
    # a record's own bad --framework is named as the record's
    with pytest.raises(FirescaleError, match=r"odd\.json: --framework 'jax' is not a framework"):
        probe_framework(CalibrationRequest(), [_recorded("odd.json", "--framework", "jax")])
    # a --framework cut short is no longer read as Horovod's: the record is refused, by name
    with pytest.raises(FirescaleError, match=r"frame\.json: `firescale train` does not take the recorded command "
                                             r"line: unrecognized arguments: --frame pytorch"):
        probe_framework(CalibrationRequest(), [_recorded("frame.json", "--frame", "pytorch")])


def _recorded(source: str, *options: str) -> MeasuredIteration:
    """A single-rank run of LeNet whose record's command line gives `options` beside the trainer's required ones."""
    return MeasuredIteration(source, "lenet_same", "", 1, 64, 0.01, 0.0, 0.01, 0.0, 100,
                             (*TRAIN_COMMAND[:-3], *options))


def test_the_probe_takes_the_process_group_the_runs_ask_for(tmp_path):
    """A pytorch calibration probes the group its runs ask for: --process-group, else the first record's command's,
    else auto (resolved by the probe's ranks as by the runs'); a tensorflow one has none to take."""
    from firescale.predict.calibration_run import probe_process_group

    plain = _recorded("a.json", "--framework", "pytorch")
    gloo = _recorded("b.json", "--framework", "pytorch", "--process-group", "gloo")
    assert probe_process_group(CalibrationRequest(), [plain], "pytorch") == "auto"
    assert probe_process_group(CalibrationRequest(), [gloo, plain], "pytorch") == "gloo"
    assert probe_process_group(CalibrationRequest(process_group="mpi"), [gloo], "pytorch") == "mpi"
    assert probe_process_group(CalibrationRequest(), [plain], "tensorflow") is None
    with pytest.raises(FirescaleError, match="--process-group gloo is the pytorch trainer's; the tensorflow trainer"):
        probe_process_group(CalibrationRequest(process_group="gloo"), [], "tensorflow")
    odd = _recorded("odd.json", "--process-group", "ucc")
    with pytest.raises(FirescaleError, match=r"odd\.json: --process-group 'ucc' is not a process group; known: auto"):
        probe_process_group(CalibrationRequest(), [odd], "pytorch")


def test_the_probe_starts_the_backends_own_bench(monkeypatch, tmp_path):
    """What each backend's probe starts as the site's ranks: Horovod's after a step shaped as the trainer's,
    the PyTorch trainer's on its own, over the process group asked for (auto unless named; the real ranks of
    both: test_overhead_calibration, test_calibrate_torch)."""
    from firescale.cluster.ranks import probe_allreduce, site_ranks
    from firescale.nets.zoo import get_net

    started: list[tuple[int, list[str], str]] = []
    here = site_ranks(load_site("local"))
    monkeypatch.setattr(type(here), "run", lambda self, n, command, what, timeout: started.append((n, command, what)))
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    probe_allreduce(here, 2, spec, tmp_path / "tf.json", step_s=0.004, batch_per_rank=32)
    probe_allreduce(here, 2, spec, tmp_path / "torch.json", step_s=0.004, batch_per_rank=32, framework="pytorch")
    probe_allreduce(here, 2, spec, tmp_path / "gloo.json", framework="pytorch", process_group="gloo")
    (n_tf, tf, what_tf), (n_torch, torch, what_torch), (_, gloo, _) = started
    assert n_tf == n_torch == 2
    assert what_tf == "the Horovod allreduce probe" and what_torch == "the torch.distributed allreduce probe"
    assert torch[torch.index("--process-groups") + 1] == "auto" and gloo[gloo.index("--process-groups") + 1] == "gloo"
    assert "--process-groups" not in tf
    assert tf[tf.index("--algorithms") + 1] == "horovod" and tf[tf.index("--compute-ms") + 1] == "4.0000"
    assert "--framework" not in tf and tf[tf.index("--batch-per-rank") + 1] == "32"
    assert torch[torch.index("--framework") + 1] == "pytorch" and torch[torch.index("--algorithms") + 1] == "torch"
    assert "--compute-ms" not in torch and "--batch-per-rank" not in torch
    for command, out in ((tf, "tf.json"), (torch, "torch.json")):
        assert command[command.index("--gradients-of") + 1] == "lenet_same"
        assert command[command.index("--input") + 1] == "8,8,1" and command[command.index("--classes") + 1] == "10"
        assert command[command.index("--json") + 1] == str(tmp_path / out)
    with pytest.raises(FirescaleError, match="how much of it hides behind backward is measured only for Horovod's"):
        probe_allreduce(here, 2, spec, tmp_path / "x.json", overlap_s=0.002, framework="pytorch")
    with pytest.raises(FirescaleError, match="the tensorflow or the pytorch trainer's allreduce, not 'jax'"):
        probe_allreduce(here, 2, spec, tmp_path / "x.json", framework="jax")
    assert len(started) == 3


def test_copies_of_the_short_run_without_a_core_each_are_refused_before_it_starts(tmp_path, monkeypatch):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(NAMED["base.json"]))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    request = CalibrationRequest(records=(str(base),), short_run=50, allreduce_probe=2,
                                 out=str(tmp_path / "calibration.json"))
    _refused_before_measuring(monkeypatch, request, load_site("local"),
                              "a contention run here needs a core for each copy: 2 copies, 1 cores")


def _refused_before_measuring(monkeypatch, request: CalibrationRequest, site, message: str) -> None:
    """run_calibration refuses `request` with `message`, says nothing and writes nothing: the short runs, the
    contention rounds and the allreduce probe fail the test if any of them starts."""
    def started(what: str):
        def fail(*args, **kwargs):
            pytest.fail(f"{what} started before the request was refused")    # not a FirescaleError: not a round
        return fail

    monkeypatch.setattr(calibration_run, "short_run", started("a short run"))
    monkeypatch.setattr(calibration_run, "node_contentions", started("a contention round"))
    monkeypatch.setattr(ranks, "probe_allreduce", started("an allreduce probe"))
    said: list[str] = []
    with pytest.raises(FirescaleError, match=re.escape(message)):
        run_calibration(request, PLATFORM, site, say=said.append)
    assert said == [] and not (request.out and Path(request.out).exists())


def test_numbers_alone_are_fitted_stored_and_summed_up(tmp_path):
    out = tmp_path / "calibration.json"
    said: list[str] = []
    done = run_calibration(replace(NUMBERS, out=str(out)), PLATFORM, None, say=said.append)
    assert done.out == out and load_calibration(out).to_dict() == done.calibration.to_dict()
    assert done.spec.name == "lenet_same" and done.spec.input_shape == (8, 8, 1) and done.spec.num_classes == 10
    assert said == []      # nothing was measured: no record, no short run, no probe
    assert 0 < done.calibration.ppp_compute < 1 and done.calibration.overhead_s == 0.0   # one batch: Paleo's
    assert done.summary().startswith("lenet_same (8, 8, 1): compute percent of peak ")
    assert done.summary().endswith(f"-> {out}")


def _digits(tmp_path):
    """A dataset folder whose manifest says 8x8 grey images of 10 classes (all the calibration reads of it)."""
    folder = tmp_path / "digits"
    folder.mkdir()
    files = {name: {"bytes": 0, "sha256": ""} for name in ("train.checksums.npy", "train.h5")}
    (folder / "manifest.json").write_text(json.dumps({
        "format": "firescale-dataset", "version": 1, "shape": [8, 8, 1], "num_classes": 10,
        "classes": [str(c) for c in range(10)], "formats": ["hdf5"],
        "splits": {"train": {"records": 0, "checksums": "train.checksums.npy", "files": files}}}))
    return folder


def test_records_give_the_net_its_shape_from_their_dataset_and_their_evaluations(tmp_path):
    """The first record names the net; its dataset's manifest gives the classes, and the input cropped as its
    command crops it; the evaluation time is the records' seconds evaluating over their evaluations."""
    from firescale.results import EvalPoint, Segment

    digits = _digits(tmp_path)
    command = ["firescale", "train", "--dataset", str(digits), "--net", "lenet_same", "--solver", "s.yaml", "--out",
               "/x", "--crop", "6"]
    base, short = tmp_path / "base.json", tmp_path / "short.json"
    evals = [EvalPoint(100 * k, 1.0, 1.0, 0.9, 1.0, 0.3) for k in (1, 2, 3)]
    base.write_text(json.dumps(run_record(train_result(
        64, 11.7, dataset=str(digits), command=command, evals=evals,
        segments=[Segment(0, 300, 1.0, 4.0, 0.6, 19200, "finished")]))))
    short.write_text(json.dumps(train_result(32, 7.5, dataset=str(digits), command=command, evals=[])))
    out = tmp_path / "calibration.json"
    said: list[str] = []
    done = run_calibration(CalibrationRequest(records=(str(base), str(short)), out=str(out)), PLATFORM, None,
                           say=said.append)
    assert (done.spec.name, done.spec.input_shape, done.spec.num_classes) == ("lenet_same", (6, 6, 1), 10)
    assert done.calibration.eval_s == pytest.approx(0.6 / 3)
    assert [r["batch_per_rank"] for r in done.calibration.compute_source["records"]] == [64, 32]
    assert done.calibration.compute_source["overhead_fitted"] is True      # two batches: the overhead too
    assert said == [f"measured: {base}: batch 64 per rank, 11.700 ms per iteration (data 3.900, compute 3.900, "
                    "allreduce 3.900) over 300 iterations",
                    f"measured: {short}: batch 32 per rank, 7.500 ms per iteration (data 2.500, compute 2.500, "
                    "allreduce 2.500) over 300 iterations"]
    # the options given win over the record's dataset
    given = run_calibration(CalibrationRequest(records=(str(base),), input_shape=(8, 8, 1), classes=10,
                                               out=str(out)), PLATFORM, None, say=said.append)
    assert given.spec.input_shape == (8, 8, 1)


def test_records_that_cannot_calibrate_are_named(tmp_path):
    two = tmp_path / "two.json"
    two.write_text(json.dumps(train_result(32, 10.5, ranks=2)))
    out = tmp_path / "calibration.json"
    with pytest.raises(FirescaleError, match=re.escape(f"{two}: calibration fits the compute factor from single-rank "
                                                       "runs; this one has 2 ranks")):
        run_calibration(CalibrationRequest(records=(str(two),), out=str(out)), PLATFORM, None)
    other = tmp_path / "other.json"     # a run of another net cannot fit this net's communication
    other.write_text(json.dumps(train_result(32, 10.5, ranks=2, net="lenet")))
    with pytest.raises(FirescaleError, match=re.escape(f"{other}: net 'lenet' is not the calibrated 'lenet_same'")):
        run_calibration(replace(NUMBERS, comm_record=str(other), out=str(out)), PLATFORM, None)
    assert not out.exists()


def test_the_shape_comes_from_the_options_else_the_manifest_and_the_recorded_crop(tmp_path):
    digits = _digits(tmp_path)

    def first(*options: str) -> MeasuredIteration:
        return replace(_recorded("r.json", *options), dataset=str(digits))

    assert net_shape(None, None, first()) == ((8, 8, 1), 10)
    assert net_shape(None, None, first("--crop=4")) == ((4, 4, 1), 10)
    assert net_shape((28, 28, 1), None, first("--crop", "4")) == ((28, 28, 1), 10)
    assert net_shape(None, 3, first()) == ((8, 8, 1), 3)
    kept = replace(first("--crop", "4"), options={**record_options(first().train_options()), "crop": 5})
    assert net_shape(None, None, kept) == ((5, 5, 1), 10)    # the record's options, not its command line
    assert net_shape(None, None, None) == (None, None)       # no record: the net's own
    lost = MeasuredIteration("r.json", "lenet_same", str(tmp_path / "gone"), 1, 64, 0.01, 0.0, 0.01, 0.0, 100)
    assert net_shape(None, None, lost) == (None, None)       # a dataset not ingested here: the net's own
    with pytest.raises(FirescaleError, match=r"r\.json: .* the recorded command line: argument --crop: expected one"):
        net_shape(None, None, first("--crop"))               # an option without its value
    with pytest.raises(FirescaleError, match=r"r\.json: .* unrecognized arguments: --cro 5"):
        net_shape(None, None, first("--cro", "5"))           # cut short: argparse took it for --crop, once


def test_a_site_with_a_scheduler_is_measured_only_from_inside_its_job(monkeypatch):
    monkeypatch.delenv("PBS_JOBID", raising=False)
    titan = load_site("titan")
    with pytest.raises(FirescaleError, match=r"--allreduce-probe measures on the nodes of site titan, whose "
                                             r"scheduler is 'torque', but this is not one of its jobs \(\$PBS_JOBID"):
        measuring_site(titan, "--allreduce-probe")
    with pytest.raises(FirescaleError) as short:
        measuring_site(titan, "--short-run")
    assert "--allreduce-json" not in str(short.value)     # only the probe has a by-hand way round
    with pytest.raises(FirescaleError, match="--short-run starts ranks as a site does: give --site"):
        measuring_site(None, "--short-run")
    monkeypatch.setenv("PBS_JOBID", "123.titan")
    assert measuring_site(titan, "--allreduce-probe") is titan
    local = load_site("local")
    assert measuring_site(local, "--short-run") is local


def test_a_failing_round_is_said_and_left_out_and_all_failing_is_the_first_failure():
    said: list[str] = []

    def measure(k: int) -> int:
        if k == 1:
            raise FirescaleError("stopped after 5 s")
        return 10 * k

    assert in_rounds(3, "allreduce probe", measure, said.append) == [0, None, 20]
    assert said == ["firescale: allreduce probe round 2 of 3 left out: stopped after 5 s"]

    def failing(k: int) -> int:
        raise FirescaleError(f"failure {k + 1}")

    with pytest.raises(FirescaleError, match="^failure 1$"):
        in_rounds(2, "contention", failing, said.append)
    assert said[1:] == ["firescale: contention round 1 of 2 left out: failure 1",
                        "firescale: contention round 2 of 2 left out: failure 2"]
