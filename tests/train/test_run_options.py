"""A run's options in its record (train/options.py): `firescale train`'s one parser, the record form its run keeps,
an old record's command line read by that same parser, and a command line built back from options."""
from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from train_helpers import train_args

from cli import run_firescale
from firescale import cli
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, PYTORCH
from firescale.predict.measurements import read_measured_iteration
from firescale.results import read_result, result_from_dict
from firescale.sweep.records import read_run_record
from firescale.train.options import (
    TrainOptions,
    options_from_command,
    options_from_record,
    record_options,
    recorded_options,
    train_command,
)

REPO = Path(__file__).resolve().parents[2]
# A sweep's run record from before runs kept their options, its command line cut short and abbreviated (`--batch`):
# the report's fixture.
OLD_RECORD = REPO / "tests" / "report" / "data" / "runs" / "baseline" / "result.json"

# Every option away from its default, so that a field the record form or the command line drops shows.
EVERYTHING = TrainOptions(
    dataset=Path("data/digits"), net="lenet_same", solver=Path("solvers/lenet.yaml"), out=Path("runs/a b"),
    overrides=["base_lr=0.02", "max_iter=-1"], batch_per_rank=32, total_batch=None, reference_batch=64,
    lr_scaling="linear", warmup_iters=100, warmup_start_lr=0.001, target=None,
    target_from=[Path("base/r0.json"), Path("base/r1.json")], tolerance=0.02, resume=True, snapshot=None,
    weights=Path("init.caffemodel"), seed=7, eval_batch=128, profile_layers=True, data_format="hdf5",
    scale=0.00390625, mean=(104.0, 117.0, 123.5), crop=6, mirror=False, threads=2, layer_plan=Path("plan.yaml"),
    batch_schedule=[(100, 16), (200, 32)], split_every=5, overlap_allreduce=True, read_limit_mbs=12.5,
    framework=PYTORCH.name, precision=PYTORCH.precisions[-1], process_group=PYTORCH.process_groups[-1],
    command=["firescale", "train", "(as given)"])
# The fields a run sets one of, each set in its own example: a per-rank or total batch, a target or its baseline,
# resuming from the newest snapshot or a named one; a mean given as a file.
OTHER_HALVES = {"batch_per_rank": None, "total_batch": 256, "target_from": None, "target": 0.97, "resume": False,
                "snapshot": Path("runs/a/snapshot_iter_5.solverstate"), "mean": "mean.binaryproto", "mirror": True}


def test_every_option_the_parser_takes_is_a_field_the_record_keeps():
    parser = cli.build_parser("train")
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {f.name for f in fields(TrainOptions)} - {"command"} == set(record_options(EVERYTHING))
    defaults = TrainOptions(dataset=Path("d"), net=None, solver=Path("s"), out=Path("o"))
    same = [f.name for f in fields(TrainOptions) if getattr(EVERYTHING, f.name) == getattr(defaults, f.name)
            and f.name not in OTHER_HALVES]
    assert same == []      # EVERYTHING sets each option: a new one must be added to it


@pytest.mark.parametrize("changes", [{}, OTHER_HALVES], ids=["one-half", "other-half"])
def test_the_record_form_is_json_and_gives_the_options_back(changes):
    from dataclasses import replace

    opts = replace(EVERYTHING, **changes)
    record = json.loads(json.dumps(record_options(opts)))     # as result.json keeps it
    assert record == record_options(opts)
    assert record["out"] == "runs/a b" and record["batch_schedule"] == [[100, 16], [200, 32]]
    back = options_from_record(record, "r.json")
    assert record_options(back) == record and back.command == []
    # the command line built from them is one the trainer's own parser reads as the same options
    command = train_command(opts)
    assert command[:2] == ["firescale", "train"] and command[-2:] == ["--out", "runs/a b"]
    assert options_from_command(command) == record
    parsed = cli.build_parser("train").parse_args(command[2:])
    assert {k: getattr(parsed, k) for k in ("crop", "framework", "process_group", "overrides")} == {
        "crop": 6, "framework": "pytorch", "process_group": opts.process_group,
        "overrides": ["base_lr=0.02", "max_iter=-1"]}
    # spelled out in full, defaults too: a changed default does not change what a repeated run trains with
    defaults = train_command(TrainOptions(dataset=Path("d"), net=None, solver=Path("s"), out=Path("o")))
    assert "--framework" in defaults and defaults[defaults.index("--framework") + 1] == DEFAULT_FRAMEWORK


def test_a_bad_record_form_is_one_sentence_naming_the_record():
    record = record_options(EVERYTHING)
    with pytest.raises(FirescaleError, match=r"^r\.json: options has unknown key 'cropping'$"):
        options_from_record({**record, "cropping": 6}, "r.json")
    with pytest.raises(FirescaleError, match=r"^r\.json: `firescale train` does not take the recorded options: "
                                             r"argument --crop: invalid int value: 'six'$"):
        options_from_record({**record, "crop": "six"}, "r.json")
    with pytest.raises(FirescaleError, match=r"^r\.json: options is list, not an object of option names$"):
        options_from_record(["--crop", "6"], "r.json")  # type: ignore[arg-type]
    with pytest.raises(FirescaleError, match=r"^r\.json: options has no run folder \(`out`\)$"):
        options_from_record({k: v for k, v in record.items() if k != "out"}, "r.json")
    with pytest.raises(FirescaleError, match=r"r\.json: `firescale train` does not take the recorded options: "
                                             r"--batch-schedule '5:1,3:2'"):
        options_from_record({**record, "batch_schedule": [[5, 1], [3, 2]]}, "r.json")


def test_an_old_records_command_line_still_gives_its_options(tmp_path):
    """A record from before runs kept their options (no `options` key) still loads, and its command line, read
    by the trainer's parser, gives what the run trained with: the readers' one way to its options."""
    old = json.loads(OLD_RECORD.read_text())
    command = ["firescale", "train", "--dataset", "/data/digits", "--net", "lenet_same", "--solver", "s.yaml",
               "--out", "/runs/b", "--total-batch", "64", "--crop=6", "--framework", "pytorch", "--resume"]
    old["train"]["command"] = command
    old["train"]["batch"]["batch_per_rank"] = 64     # as calibration needs it (records since have it)
    assert "options" not in old["train"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(old))
    measured = read_measured_iteration(path)
    assert measured.options == {} and measured.command == tuple(command)
    opts = measured.train_options()
    assert opts is not None and opts.command == command
    assert (opts.framework, opts.crop, opts.total_batch, opts.batch_per_rank, opts.resume, opts.process_group) == (
        "pytorch", 6, 64, None, True, "auto")
    assert record_options(opts) == options_from_command(command)
    # a record that keeps its options is read from them, whatever its command line says
    kept = copy.deepcopy(old)
    kept["train"]["options"] = {**record_options(opts), "crop": 4}
    path.write_text(json.dumps(kept))
    assert read_measured_iteration(path).train_options().crop == 4
    assert recorded_options({}, [], "r.json") is None       # neither: nothing to read


def test_an_abbreviated_or_cut_short_command_line_is_refused_naming_its_record(tmp_path):
    """What prefix matching used to take is refused now, by the trainer and in a record alike: `--frame pytorch`
    trained with PyTorch while a reader looking for --framework found none, and probed Horovod."""
    train = read_run_record(OLD_RECORD).train     # the record itself still loads
    assert train is not None and train.options == {}
    assert train.command == ["firescale", "train", "--net", "lenet_same", "--batch", "64"]
    with pytest.raises(FirescaleError, match=re.escape(
            f"{OLD_RECORD}: `firescale train` does not take the recorded command line: the following arguments are "
            "required: --dataset, --solver, --out")):
        recorded_options(train.options, train.command, str(OLD_RECORD))
    full = ["firescale", "train", "--dataset", "d", "--solver", "s.yaml", "--out", "o"]
    with pytest.raises(FirescaleError, match=re.escape(
            "old.json: `firescale train` does not take the recorded command line: unrecognized arguments: --batch 64; "
            "options are read spelled out in full (firescale train takes no abbreviation)")):
        options_from_command([*full, "--batch", "64"], "old.json")
    with pytest.raises(FirescaleError, match=r"^old\.json: .* unrecognized arguments: --frame pytorch; options are "):
        options_from_command([*full, "--frame", "pytorch"], "old.json")
    with pytest.raises(FirescaleError, match=r"^old\.json: .* the following arguments are required: --out$"):
        options_from_command(full[:-2], "old.json")
    with pytest.raises(FirescaleError, match=r"^old\.json: the recorded command line 'firescale bench io' is not "
                                             r"`firescale train`'s$"):
        options_from_command(["firescale", "bench", "io"], "old.json")
    proc = run_firescale(*train_args(tmp_path, "run", "s.yaml", "--frame", "pytorch"))
    assert proc.returncode == 2 and "firescale train: error: unrecognized arguments: --frame pytorch" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.pytorch
def test_a_runs_record_keeps_the_options_it_trained_with(digits_dataset, tmp_path):
    """A real run's result.json keeps its options as the trainer resolved them, the same as its command line
    gives; a short calibration run built from them trains as the recorded run did, at its own batch."""
    from firescale.predict.measurements import short_run_command

    solver = tmp_path / "s.yaml"
    solver.write_text("type: SGD\nbase_lr: 0.01\nlr_policy: fixed\nmax_iter: 6\ntest_interval: 0\nsnapshot: 0\n"
                      "display: 0\ntest_initialization: false\nrandom_seed: 3\n")
    proc = run_firescale("train", "--dataset", digits_dataset, "--net", "lenet_same", "--solver", solver,
                         "--out", tmp_path / "run", "--framework", "pytorch", "--process-group", "gloo",
                         "--crop", "6", "--total-batch", "16", "--split-every", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = read_result(tmp_path / "run" / "result.json")
    assert result.options == options_from_command(result.command, "result.json")
    assert (result.options["framework"], result.options["process_group"], result.options["crop"]) == (
        "pytorch", "gloo", 6)
    assert result.options["total_batch"] == 16 and result.options["batch_per_rank"] is None
    assert result_from_dict(result.to_dict()).options == result.options
    short = short_run_command(options_from_record(result.options), 8, 5, tmp_path / "short", 16)
    assert short[:4] == [sys.executable, "-m", "firescale", "train"]
    assert short[-2:] == ["--out", str(tmp_path / "short")]
    again = options_from_command(["firescale", *short[3:]])
    assert {k: again[k] for k in ("framework", "process_group", "crop", "batch_per_rank", "total_batch",
                                  "lr_scaling", "reference_batch")} == {
        "framework": "pytorch", "process_group": "gloo", "crop": 6, "batch_per_rank": 8, "total_batch": None,
        "lr_scaling": "linear", "reference_batch": 16}
    assert again["overrides"][-6:] == ["max_iter=5", "test_interval=0", "test_initialization=false", "snapshot=0",
                                       "snapshot_after_train=false", "display=5"]
