"""Solver files in YAML and Caffe prototxt; unknown keys and bad values name the key."""
from __future__ import annotations

import pytest

from firescale.errors import FirescaleError
from firescale.train.solver_config import load_solver, parse_prototxt, solver_from_mapping

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


def test_nested_prototxt_message_is_refused():
    with pytest.raises(FirescaleError, match="net_param"):
        parse_prototxt("net_param { name: 'x' }", "s.prototxt")


def test_bad_extension(tmp_path):
    path = tmp_path / "solver.cfg"
    path.write_text("base_lr: 1")
    with pytest.raises(FirescaleError, match="must end in"):
        load_solver(path)
