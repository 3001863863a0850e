"""Solver files in YAML and Caffe prototxt; unknown keys and bad values name the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from firescale.caffe.prototxt import parse_prototxt
from firescale.caffe.solver import ignored_note, load_solver, solver_from_mapping
from firescale.errors import FirescaleError

CAFFE = Path(__file__).parent / "data" / "caffe"   # Caffe's own files, verbatim (see its README)
OLD_CAFFE = CAFFE / "at-c1f7fe1cffa4388886b735f49cd915fad905fca4"

LENET_PROTOTXT = '''
# The train/test net protocol buffer definition
net: "examples/mnist/lenet_train_test.prototxt"
test_iter: 100
test_interval: 500
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 100
max_iter: 10000
snapshot: 5000
snapshot_prefix: "lenet"
solver_mode: GPU
type: "Nesterov"
'''


def test_caffe_prototxt(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text(LENET_PROTOTXT)
    cfg = load_solver(path, ["base_lr=0.02", "stepvalue=[5, 7]"])
    assert (cfg.type, cfg.lr_policy, cfg.base_lr, cfg.gamma, cfg.power) == ("Nesterov", "inv", 0.02, 0.0001, 0.75)
    assert (cfg.test_iter, cfg.test_interval, cfg.max_iter, cfg.snapshot_prefix) == (100, 500, 10000, "lenet")
    assert cfg.ignored == {"net": "examples/mnist/lenet_train_test.prototxt", "solver_mode": "GPU"}
    assert cfg.stepvalue == [5, 7]


def test_prototxt_repeated_stepvalue_and_old_solver_type():
    raw = parse_prototxt('lr_policy: "multistep"\nstepvalue: 100\nstepvalue: 200 # c\nsolver_type: ADAGRAD\n', "s")
    assert raw["stepvalue"] == [100, 200]
    cfg = solver_from_mapping({**raw, "gamma": 0.1, "base_lr": 0.1, "max_iter": 300})
    assert cfg.type == "AdaGrad" and cfg.stepvalue == [100, 200]


def test_yaml(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("type: Adam\nbase_lr: 0.001\nmomentum: 0.9\nmax_iter: 50\nlr_mult: {ip1: [1, 2]}\n")
    cfg = load_solver(path)
    assert cfg.type == "Adam" and cfg.momentum2 == 0.999 and cfg.delta == 1e-8 and cfg.lr_mult == {"ip1": [1.0, 2.0]}


@pytest.mark.parametrize("raw, key", [
    ({"base_lr": 0.1, "max_iter": 10, "learning_rate": 3}, "learning_rate"),
    ({"base_lr": 0.1, "max_iter": 10, "type": "Momentum"}, "type"),
    ({"base_lr": -1, "max_iter": 10}, "base_lr"),
    ({"base_lr": 0.1, "max_iter": "ten"}, "max_iter"),
    ({"base_lr": 0.1}, "max_iter"),
    ({"base_lr": 0.1, "max_iter": 10, "lr_policy": "step", "gamma": 0.1}, "stepsize"),
    ({"base_lr": 0.1, "max_iter": 10, "lr_policy": "inv", "gamma": 0.1}, "power"),
    ({"base_lr": 0.1, "max_iter": 10, "lr_policy": "multistep", "gamma": 0.1, "stepvalue": [5, 3]}, "stepvalue"),
    ({"base_lr": 0.1, "max_iter": 10, "lr_policy": "cosine"}, "lr_policy"),
    ({"base_lr": 0.1, "max_iter": 10, "type": "AdaGrad", "momentum": 0.9}, "momentum"),
    ({"base_lr": 0.1, "max_iter": 10, "momentum": 1.5}, "momentum"),
    ({"base_lr": 0.1, "max_iter": 10, "regularization_type": "L3"}, "regularization_type"),
    ({"base_lr": 0.1, "max_iter": 10, "iter_size": 0}, "iter_size"),
    ({"base_lr": 0.1, "max_iter": 10, "snapshot_after_train": "maybe"}, "snapshot_after_train"),
])
def test_bad_solver_names_the_key(raw, key):
    with pytest.raises(FirescaleError, match=repr(key)):
        solver_from_mapping(raw, "s.yaml")


def test_a_message_on_a_solver_key_is_refused():
    with pytest.raises(FirescaleError, match="'base_lr' takes a value, not a message"):
        solver_from_mapping(parse_prototxt("base_lr { x: 1 }\nmax_iter: 3", "s.prototxt"), "s.prototxt")


def test_bad_extension(tmp_path):
    path = tmp_path / "solver.cfg"
    path.write_text("base_lr: 1")
    with pytest.raises(FirescaleError, match="must end in"):
        load_solver(path)


# ------------------------------------------------------------ Caffe's own solver files, as Caffe reads them


@pytest.mark.parametrize("path, expected", [
    ("examples/mnist/lenet_solver.prototxt",
     {"type": "SGD", "base_lr": 0.01, "lr_policy": "inv", "gamma": 0.0001, "power": 0.75, "max_iter": 10000,
      "test_iter": 100, "test_interval": 500, "snapshot": 5000, "snapshot_prefix": "examples/mnist/lenet"}),
    ("examples/cifar10/cifar10_quick_solver.prototxt",
     {"base_lr": 0.001, "lr_policy": "fixed", "weight_decay": 0.004, "max_iter": 4000,
      "snapshot_prefix": "examples/cifar10/cifar10_quick"}),
    ("models/bvlc_googlenet/quick_solver.prototxt",
     {"lr_policy": "poly", "power": 0.5, "max_iter": 2400000, "weight_decay": 0.0002, "average_loss": 40,
      "test_initialization": False, "test_iter": 1000}),
    ("models/bvlc_alexnet/solver.prototxt",
     {"lr_policy": "step", "gamma": 0.1, "stepsize": 100000, "max_iter": 450000, "momentum": 0.9}),
    ("examples/mnist/lenet_multistep_solver.prototxt",
     {"lr_policy": "multistep", "gamma": 0.9, "stepvalue": [5000, 7000, 8000, 9000, 9500]}),
])
def test_caffes_solver_files_load_verbatim(path, expected):
    cfg = load_solver(CAFFE / path)
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.ignored["net"].startswith(path.split("/")[0] + "/")
    assert cfg.ignored["net"].endswith(("_train_test.prototxt", "/train_val.prototxt"))
    assert cfg.ignored["solver_mode"] == "GPU"
    assert cfg.snapshot_name == cfg.snapshot_prefix.rsplit("/", 1)[-1]  # snapshots/<last component>_iter_N


def test_caffes_default_tests_at_initialization():
    assert load_solver(CAFFE / "examples/mnist/lenet_solver.prototxt").test_initialization is True


def test_test_nets_and_their_states_are_accepted_and_reported_as_ignored():
    cfg = load_solver(CAFFE / "examples/mnist/mnist_autoencoder_solver.prototxt")
    assert cfg.test_iter is None                         # two test nets: the one test split is read whole
    assert cfg.ignored["test_iter"] == [500, 100]
    assert cfg.ignored["test_state"] == [{"stage": "test-on-train"}, {"stage": "test-on-test"}]
    assert cfg.ignored["test_compute_loss"] is True
    note = ignored_note(cfg)
    assert note.startswith("solver keys ignored") and "test_state" in note and "solver_mode" in note


def test_an_inline_net_is_accepted_and_ignored():
    cfg = load_solver(CAFFE / "examples/mnist/lenet_consolidated_solver.prototxt")
    assert cfg.random_seed == 1701 and cfg.max_iter == 10000 and cfg.snapshot_name == "lenet"
    net = cfg.ignored["net_param"]
    assert net["name"] == "LeNet" and [layer["name"] for layer in net["layers"]][:2] == ["mnist", "mnist"]
    assert len(net["layers"]) == 12 and net["layers"][-1]["type"] == "SOFTMAX_LOSS"


def test_the_deprecated_solver_type_enum_still_works():
    cfg = load_solver(OLD_CAFFE / "examples/mnist/mnist_autoencoder_solver_nesterov.prototxt")
    assert cfg.type == "Nesterov" and cfg.momentum == 0.95 and "solver_type" not in cfg.to_dict()
    by_number = solver_from_mapping({"solver_type": 5, "base_lr": 0.001, "max_iter": 5, "momentum": 0.9})
    assert by_number.type == "Adam"
    overridden = load_solver(OLD_CAFFE / "examples/mnist/mnist_autoencoder_solver_nesterov.prototxt", ["type=SGD"])
    assert overridden.type == "SGD"


def test_solver_type_beside_type_is_refused_as_caffe_refuses_it():
    with pytest.raises(FirescaleError, match="'solver_type' and 'type' cannot both be given"):
        solver_from_mapping({"solver_type": "SGD", "type": "Adam", "base_lr": 0.1, "max_iter": 5})
    with pytest.raises(FirescaleError, match="'solver_type' must be one of SGD, NESTEROV"):
        solver_from_mapping({"solver_type": "Sgd", "base_lr": 0.1, "max_iter": 5})


def test_snapshot_prefix_is_completed_as_caffe_completes_it(tmp_path):
    path = tmp_path / "my_solver.prototxt"
    path.write_text("base_lr: 0.1\nmax_iter: 5\n")
    assert load_solver(path).snapshot_name == "my_solver"              # none given: the solver file's name
    path.write_text('base_lr: 0.1\nmax_iter: 5\nsnapshot_prefix: "snapshots/"\n')
    cfg = load_solver(path)
    assert cfg.snapshot_prefix == "snapshots/my_solver" and cfg.snapshot_name == "my_solver"  # a folder
    path.write_text('base_lr: 0.1\nmax_iter: 5\nsnapshot_prefix: ".."\n')
    with pytest.raises(FirescaleError, match="'snapshot_prefix' must end in a file-name prefix"):
        load_solver(path)
