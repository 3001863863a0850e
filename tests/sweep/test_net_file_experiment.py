"""An experiment that names a Caffe net file: checked when the sweep is planned, passed to its jobs as an
absolute, quoted path, and hashed in the report's provenance."""
from __future__ import annotations

import copy
import hashlib
import shlex
from pathlib import Path

import pytest
import yaml

from firescale.errors import FirescaleError
from firescale.jobs.render import render_job_script
from firescale.report.provenance import collect_provenance, provenance_lines
from firescale.resources import caffe_zoo_file
from firescale.sweep.descriptions import write_config
from firescale.sweep.jobs import job_for_point, train_command
from firescale.sweep.net_file import net_file_digest
from firescale.sweep.plan import SweepPlan, load_plan

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "fashion-cifar10-quick"
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
CONFIG["experiments"].update(
    yaml.safe_load((REPO / "workflow" / "examples" / f"{EXAMPLE}.yaml").read_text())["experiments"])
QUICK = caffe_zoo_file("cifar10/cifar10_quick_train_test.prototxt").read_text()


def _project(tmp_path: Path, net: str, text: str | None = QUICK) -> dict:
    """A project folder (with a space in its name) whose experiment names `net`, written with `text`."""
    if text is not None:
        (tmp_path / net).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / net).write_text(text)
    config = copy.deepcopy(CONFIG)
    exp = config["experiments"][EXAMPLE]
    exp["net"] = net
    exp["solver"] = str(REPO / exp["solver"])
    return {**config, "site": "local"}


def test_the_example_plans_caffes_file_and_its_jobs_get_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no dataset here: the file's layers are checked, its shapes wait for ingest
    plan = SweepPlan.build({**CONFIG, "site": "local"}, experiments=[EXAMPLE], base=REPO)
    assert [p.name for p in plan.points[EXAMPLE]] == ["baseline", "g2-b100-r0", "g2-b200-r0"]
    # the example reads the project's copy of Caffe's file, not a built-in net
    assert plan.net(EXAMPLE) == str(REPO / "src/firescale/nets/caffe_zoo/cifar10/cifar10_quick_train_test.prototxt")
    argv = train_command(plan, EXAMPLE, plan.point(EXAMPLE, "g2-b200-r0"))
    assert argv[argv.index("--net") + 1] == plan.net(EXAMPLE)
    # Caffe's pixel range, as its example: the experiment's transform reaches the trainer
    assert argv[argv.index("--scale") + 1] == "1" and argv[argv.index("--mean") + 1] == "73"
    assert "--crop" not in argv and "--mirror" not in argv and "--no-mirror" not in argv   # the file's say
    nin = load_plan("titan", REPO / "workflow" / "config.yaml", experiments=["nin-imagenet"])
    argv = train_command(nin, "nin-imagenet", nin.point("nin-imagenet", "baseline"))
    assert argv[argv.index("--scale"):argv.index("--resume")] == ["--scale", "1", "--mean", "104,117,123",
                                                                   "--crop", "224", "--mirror"]
    # before the dataset is ingested, the prediction says why it cannot size the file's input
    from firescale.predict.experiment import predict_experiment

    with pytest.raises(FirescaleError, match=f"experiment {EXAMPLE}: the net file {plan.net(EXAMPLE)} does not give "
                                             f"its input's size and dataset 'fashion-mnist' is not ingested yet"):
        predict_experiment(plan, EXAMPLE)


def test_a_relative_net_file_reaches_the_job_script_absolute_and_quoted(tmp_path, monkeypatch):
    project = tmp_path / "my project"
    monkeypatch.chdir(tmp_path)
    config = _project(project, "nets/quick net.prototxt")
    plan = SweepPlan.build(config, experiments=[EXAMPLE], base=project)
    net = project / "nets" / "quick net.prototxt"
    assert plan.net(EXAMPLE) == str(net)
    script = render_job_script(plan.site, job_for_point(plan, EXAMPLE, plan.point(EXAMPLE, "baseline")))
    assert f"--net {shlex.quote(str(net))} " in script
    # the workflow's copy of the experiments names the same file, wherever it is written, relative to the
    # folder the commands run in (here no project: the working directory), so that a moved folder is the same
    again = load_plan("local", write_config(plan, tmp_path / "results" / "local" / "experiments.yaml"),
                      experiments=[EXAMPLE])
    assert again.experiment(EXAMPLE)["net"] == "my project/nets/quick net.prototxt" and again.net(EXAMPLE) == str(net)
    # the report says which file ran, by its hash
    digest = hashlib.sha256(net.read_bytes()).hexdigest()
    assert net_file_digest(plan.net(EXAMPLE)) == {"path": str(net), "sha256": digest}
    assert net_file_digest("lenet") is None
    prov = collect_provenance([], site={"name": "local"}, repo=tmp_path, command=["firescale", "report"],
                              net_file=net_file_digest(plan.net(EXAMPLE)))
    assert f"net file: {net}, sha256 {digest} (read when this report was made)" in provenance_lines(prov)


def test_a_missing_or_unusable_net_file_is_refused_when_the_sweep_is_planned(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = _project(tmp_path, "nets/mine.prototxt", text=None)
    with pytest.raises(FirescaleError) as refused:
        SweepPlan.build(missing, experiments=[EXAMPLE], base=tmp_path, source="workflow/config.yaml")
    assert str(refused.value).startswith(
        f"workflow/config.yaml: experiment {EXAMPLE}: key 'net' names the net file 'nets/mine.prototxt', but "
        f"{tmp_path / 'nets' / 'mine.prototxt'} does not exist; give a Caffe net file (.prototxt) relative to the "
        f"project folder {tmp_path} or as an absolute path, or a built-in net: lenet_same, nin")
    bad = _project(tmp_path, "nets/bad.prototxt", QUICK.replace('type: "Pooling"', 'type: "SPP"', 1))
    with pytest.raises(FirescaleError) as refused:
        SweepPlan.build(bad, experiments=[EXAMPLE], base=tmp_path, source="workflow/config.yaml")
    message = str(refused.value)
    assert message.startswith(f"workflow/config.yaml: experiment {EXAMPLE}: key 'net' names the net file "
                              f"'nets/bad.prototxt', which firescale cannot use: ")
    assert "'pool1'" in message and "SPP" in message, message
    # a built-in name that is not one, and a value on two lines, are refused by the schema
    for net in ("resnet", "nets/a\nb.prototxt"):
        with pytest.raises(FirescaleError, match="expected a built-in net .* a Caffe net file"):
            SweepPlan.build(_project(tmp_path, net, text=None), experiments=[EXAMPLE], base=tmp_path)


def test_the_schemas_built_in_nets_are_the_zoos():
    from firescale.nets.zoo import NET_NAMES
    from firescale.sweep.config import config_schema

    net = config_schema()["$defs"]["experiment"]["properties"]["net"]
    assert tuple(net["anyOf"][0]["enum"]) == NET_NAMES



# A user's own small net whose TRAIN data layer crops the 8x8 digits to 6x6, as Caffe's ImageNet files crop
# 256x256 images to 227 or 224.
CROPPING_NET = """name: "TinyCrop"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  transform_param { crop_size: 6 } data_param { source: "digits_train_lmdb" batch_size: 16 backend: LMDB } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
  transform_param { crop_size: 6 } data_param { source: "digits_test_lmdb" batch_size: 100 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""


def test_the_prediction_reads_the_input_the_trainer_crops_from_the_net_files_data_layer(tmp_path, monkeypatch):
    """Without a crop in the experiment the trainer crops as the net file's TRAIN data layer says; the
    prediction sizes the net for that crop, not for the stored images (the experiment's crop wins in both)."""
    from firescale.cli import main
    from firescale.predict.experiment import predict_experiment
    from firescale.train.data_layers import data_transform, read_data_layers

    monkeypatch.chdir(tmp_path)   # the local site's relative datasets folder
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "tiny.prototxt").write_text(CROPPING_NET)
    digits = yaml.safe_load((REPO / "tests" / "workflow" / "digits-lenet.yaml").read_text())["experiments"]
    config = {**copy.deepcopy(CONFIG), "site": "local"}
    config["experiments"]["digits-lenet"] = {**digits["digits-lenet"], "net": "nets/tiny.prototxt",
                                             "solver": str(REPO / "workflow" / "solvers" / "lenet-digits.yaml")}
    plan = SweepPlan.build(config, experiments=["digits-lenet"], base=tmp_path)
    assert main(["data", "ingest", "--source", "digits", "--out", str(plan.dataset_dir("digits-lenet").parent)]) == 0

    trainer = data_transform(read_data_layers(plan.net("digits-lenet")), scale=None, mean=None, crop=None,
                             mirror=None)[0]
    model = predict_experiment(plan, "digits-lenet")["model"]
    assert trainer.crop == 6 and model["input_shape"] == [6, 6, 1] and model["classes"] == 10

    config["experiments"]["digits-lenet"]["dataset"] = {**digits["digits-lenet"]["dataset"], "transform": {"crop": 7}}
    plan = SweepPlan.build(config, experiments=["digits-lenet"], base=tmp_path)
    assert predict_experiment(plan, "digits-lenet")["model"]["input_shape"] == [7, 7, 1]


def test_a_mean_file_the_runs_cannot_read_is_refused_when_the_sweep_is_planned(tmp_path, monkeypatch):
    """Caffe's CIFAR-10 quick file reads mean_file "examples/cifar10/mean.binaryproto" (relative to Caffe's
    folder); the runs read it beside the net file.  Missing there, and not replaced by the experiment's own
    mean, every run would fail after the queue: the plan refuses it first.  So does a missing mean file the
    experiment names."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    config = _project(tmp_path, "nets/quick.prototxt")
    exp = config["experiments"][EXAMPLE]
    exp["dataset"] = {**exp["dataset"], "transform": {"scale": 1.0}}      # no mean: the net file's
    beside = tmp_path / "nets" / "examples" / "cifar10" / "mean.binaryproto"
    with pytest.raises(FirescaleError) as refused:
        SweepPlan.build(config, experiments=[EXAMPLE], base=tmp_path, source="workflow/config.yaml")
    assert str(refused.value) == (
        f"workflow/config.yaml: experiment {EXAMPLE}: {tmp_path / 'nets' / 'quick.prototxt'}: the TRAIN data layer "
        f"'cifar' transform_param mean_file: 'examples/cifar10/mean.binaryproto' is not at {beside}, where the runs "
        f"would read it (beside the net file); set the experiment's dataset.transform.mean to the mean file or to "
        f"per-channel values")
    exp["dataset"]["transform"]["mean"] = "data/mean.npy"                 # the experiment's own, not there
    with pytest.raises(FirescaleError, match=f"key 'dataset.transform.mean' names the mean file 'data/mean.npy', "
                                             f"but {tmp_path / 'data' / 'mean.npy'} does not exist"):
        SweepPlan.build(config, experiments=[EXAMPLE], base=tmp_path, source="workflow/config.yaml")
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "mean.npy", np.full((28, 28, 1), 73.0, np.float32))
    SweepPlan.build(config, experiments=[EXAMPLE], base=tmp_path)        # there now: planned
    exp["dataset"]["transform"].pop("mean")
    from firescale.caffe.caffemodel import blob_bytes
    from firescale.caffe.datum import parse_blobproto_mean

    beside.parent.mkdir(parents=True)
    beside.write_bytes(blob_bytes(np.full((1, 1, 28, 28), 73.0, np.float32)))   # a mean image, as Caffe writes it
    assert parse_blobproto_mean(beside.read_bytes()).shape == (28, 28, 1)
    SweepPlan.build(config, experiments=[EXAMPLE], base=tmp_path)           # beside the net file: planned


def test_an_experiments_mirror_false_reaches_the_runs_and_wins_over_the_net_files(tmp_path, monkeypatch):
    """A net file may say `mirror: true`; an experiment that says `mirror: false` gives its runs --no-mirror, and
    one that says nothing leaves the file's (the trainer reads it), as crop and mean."""
    from firescale.train.data_layers import data_transform, read_data_layers

    monkeypatch.chdir(tmp_path)
    mirrored = QUICK.replace("mean_file:", "mirror: true\n    mean_file:", 1)      # the TRAIN layer's transform
    config = _project(tmp_path, "nets/quick.prototxt", mirrored)
    transform = config["experiments"][EXAMPLE]["dataset"]["transform"]
    for given, option in ((None, None), (False, "--no-mirror"), (True, "--mirror")):
        if given is None:
            transform.pop("mirror", None)
        else:
            transform["mirror"] = given
        plan = SweepPlan.build(config, experiments=[EXAMPLE], base=tmp_path)
        argv = train_command(plan, EXAMPLE, plan.point(EXAMPLE, "baseline"))
        flags = [a for a in argv if a in ("--mirror", "--no-mirror")]
        assert flags == ([option] if option else []), (given, argv)
        mirror = {None: None, "--mirror": True, "--no-mirror": False}[option]
        runs = data_transform(read_data_layers(plan.net(EXAMPLE)), scale=None, mean=(73.0,), crop=None,
                              mirror=mirror)[0]
        assert runs.mirror is (True if given is None else given)
