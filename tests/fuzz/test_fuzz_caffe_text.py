"""Fuzzing the readers of Caffe's text files: net files (as `predict layers --net` and the sweep read them),
solver files (prototxt and YAML, with `--set` overrides, and the learning rate their schedule gives) and layer
plans (read, then checked against LeNet).  Every input comes from a file the repository ships (Caffe's zoo and
examples, the workflow's solvers and plans), its tokens or its parsed tree changed."""
from __future__ import annotations

import math

import pytest
import yaml
from fuzzing import budget, read_or_refuse, scratch_file, shipped, trial
from hypothesis import given
from hypothesis import strategies as st
from mutate import mutated_text, mutated_tree, prototxt, tree_words, wild_values

from firescale.caffe.prototxt import parse_prototxt
from firescale.errors import FirescaleError

pytestmark = pytest.mark.fuzz

NET_FILES = shipped("src/firescale/nets/caffe_zoo/*/*.prototxt", "tests/caffe/net_files/*.prototxt")
NETS = {p.name: p.read_text() for p in NET_FILES}
NET_TREES = {name: parse_prototxt(text, name, net=True) for name, text in NETS.items()}
NET_WORDS = sorted({w for tree in NET_TREES.values() for w in tree_words(tree)})
# A net file whose data layer gives no image size is read with one (`--input`), as a user must.
SHAPES = st.sampled_from([None, (28, 28, 1), (32, 32, 3), (227, 227, 3)])

SOLVER_FILES = shipped("tests/train/data/caffe/**/*solver*.prototxt", "workflow/solvers/*")
SOLVERS = {p.name: p.read_text() for p in SOLVER_FILES}


def _solver_tree(name: str, text: str) -> dict:
    return (yaml.safe_load(text) or {}) if name.endswith(".yaml") else parse_prototxt(text, name)


SOLVER_TREES = {name: _solver_tree(name, text) for name, text in SOLVERS.items()}
SOLVER_WORDS = sorted({w for tree in SOLVER_TREES.values() for w in tree_words(tree)}
                      | {"lr_policy", "gamma", "power", "stepsize", "stepvalue", "momentum2", "delta", "rms_decay",
                         "iter_size", "average_loss", "clip_gradients", "type", "solver_type", "exp", "inv", "poly",
                         "sigmoid", "multistep", "step", "fixed", "Adam", "AdaDelta", "AdaGrad", "RMSProp",
                         "Nesterov", "SGD"})

PLAN_FILES = shipped("workflow/plans/*.prototxt")
PLANS = {p.name: p.read_text() for p in PLAN_FILES}
LENET_PLAN_YAML = {"dist": {"train": [[{"name": "conv1", "device": 0}, {"name": "conv2", "device": 1}]],
                            "test": [[{"name": "conv1", "device": 0}]]}}


# ---------------------------------------------------------------- net files

def read_net_file(name: str, text: str, input_shape=None, classes=None) -> None:
    """The net file read as `predict layers --net` reads it (its layers' costs and branch bounds too), and as
    the sweep checks it; for the TEST phase as the trainer's test net."""
    from firescale.model.layers import branch_bounds, net_cost
    from firescale.nets.caffe_file import check_net_file, load_net_file
    from firescale.nets.zoo import get_net
    from firescale.train.net_file import net_file_settings

    path = scratch_file(name, text, "nets")
    with trial("net file"):
        spec = read_or_refuse(lambda: get_net(str(path), num_classes=classes, input_shape=input_shape), path)
        if spec is not None:
            cost = net_cost(spec, 8)
            branch_bounds(spec, [layer.forward_flops for layer in cost.layers])
            assert cost.params >= 0 and cost.forward_flops >= 0
            read_or_refuse(lambda: net_file_settings(spec), path)   # what the trainer takes from the file
        read_or_refuse(lambda: check_net_file(path, input_shape=input_shape, num_classes=classes), path)
        read_or_refuse(lambda: load_net_file(path, phase="TEST"), path)


@budget(100)
@given(st.data())
def test_a_net_files_tokens_changed_give_a_net_or_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(NETS)))
    read_net_file(name, data.draw(mutated_text(NETS[name], NET_WORDS)), data.draw(SHAPES))


@budget(150)
@given(st.data())
def test_a_net_files_layers_changed_give_a_net_or_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(NETS)))
    read_net_file(name, prototxt(data.draw(mutated_tree(NET_TREES[name], NET_WORDS))), data.draw(SHAPES))


@budget(40)
@given(st.sampled_from(sorted(NETS)), st.one_of(st.none(), st.tuples(st.integers(1, 600), st.integers(1, 600),
                                                                     st.integers(1, 8))),
       st.one_of(st.none(), st.integers(1, 100_000)))
def test_a_net_file_at_any_input_and_class_count_gives_a_net_or_one_sentence(name, shape, classes):
    read_net_file(name, NETS[name], shape, classes)


# ---------------------------------------------------------------- solver files

def read_solver_file(name: str, text: str, overrides: list[str] = ()) -> None:
    """The solver as `train` reads it (keys, overrides, checks), then the learning rate it gives over its run
    and at another batch (a sweep's schedule): a real number at every iteration."""
    from firescale.caffe.lr_policies import current_step, learning_rate, schedule_for_batch
    from firescale.caffe.solver import load_solver

    path = scratch_file(name, text, "solvers")
    with trial("solver file"):
        config = read_or_refuse(lambda: load_solver(path, overrides), [path, "--set"])
        if config is None:
            return
        last = config.max_iter - 1   # the rate of each update, iterations 0..max_iter-1
        for it in sorted({0, 1, config.max_iter // 2, last, *config.stepvalue, config.stepsize or 0} - {-1}):
            if it > last:
                continue
            rate = learning_rate(config, it)
            assert isinstance(rate, float) and math.isfinite(rate) and rate >= 0, (it, rate)
            current_step(config, it)
        for ratio in (0.5, 2.0):
            schedule_for_batch(config, ratio, max(1, config.max_iter))


@budget(100)
@given(st.data())
def test_a_solver_files_tokens_changed_give_a_solver_or_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(SOLVERS)))
    read_solver_file(name, data.draw(mutated_text(SOLVERS[name], SOLVER_WORDS)))


@budget(150)
@given(st.data())
def test_a_solver_files_keys_changed_give_a_solver_or_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(SOLVERS)))
    tree = data.draw(mutated_tree(SOLVER_TREES[name], SOLVER_WORDS))
    text = yaml.safe_dump(tree) if name.endswith(".yaml") and isinstance(tree, dict) else (
        prototxt(tree) if isinstance(tree, dict) else yaml.safe_dump(tree))
    read_solver_file(name, text)


@budget(60)
@given(st.sampled_from(sorted(SOLVERS)),
       st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(SOLVER_WORDS),
                                    st.one_of(st.text(max_size=10), wild_values().map(yaml.safe_dump))),
                          st.text(max_size=20)), max_size=3))
def test_a_solver_with_any_overrides_gives_a_solver_or_one_sentence(name, overrides):
    read_solver_file(name, SOLVERS[name], overrides)


# ---------------------------------------------------------------- layer plans

def read_plan(name: str, text: str) -> None:
    """The plan as the trainer reads it (`--layer-plan`), then checked against LeNet on two devices, arch by arch."""
    from firescale.nets.device_plan import arch_devices, check_devices, read_layer_plan
    from firescale.nets.zoo import get_net

    path = scratch_file(name, text, "plans")
    spec = get_net("lenet", num_classes=10, input_shape=(28, 28, 1))
    with trial("layer plan"):
        plan = read_or_refuse(lambda: read_layer_plan(path), path)
        if plan is None:
            return
        assert plan.devices >= 1
        for k, arch in enumerate((*plan.train, *plan.test)):
            read_or_refuse(lambda a=arch, k=k: arch_devices(a, spec, f"{path}: dist arch {k}"), path)
        read_or_refuse(lambda: check_devices(plan, 2, "this replica"), path)


@budget(80)
@given(st.data())
def test_a_layer_plans_tokens_changed_give_a_plan_or_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(PLANS)))
    read_plan(name, data.draw(mutated_text(PLANS[name], ["dist", "arch", "layer_assign", "name", "device", "conv1",
                                                          "pool1", "ip2", "loss"])))


@budget(60)
@given(st.data())
def test_a_layer_plans_tree_changed_gives_a_plan_or_one_sentence(data):
    words = ["dist", "train", "test", "name", "device", "conv1", "conv2", "pool2", "ip1", "arch", "layer_assign"]
    if data.draw(st.booleans()):
        name = data.draw(st.sampled_from(sorted(PLANS)))
        text = prototxt(data.draw(mutated_tree(parse_prototxt(PLANS[name], name), words)))
    else:
        name = "lenet-2-devices.yaml"
        text = yaml.safe_dump(data.draw(mutated_tree(LENET_PLAN_YAML, words)))
    read_plan(name, text)


def test_the_shipped_files_read_as_they_are():
    """The unmutated files are read without an error: the fuzzing starts from valid inputs."""
    from firescale.caffe.solver import load_solver
    from firescale.nets.caffe_file import check_net_file
    from firescale.nets.device_plan import read_layer_plan
    from firescale.nets.zoo import get_net

    for path in NET_FILES:
        get_net(str(path), input_shape=None if check_net_file(path) else (32, 32, 3))
    for path in SOLVER_FILES:
        load_solver(path)
    for path in PLAN_FILES:
        assert read_layer_plan(path) is not None
    with pytest.raises(FirescaleError):
        read_layer_plan(scratch_file("empty.prototxt", "", "plans")) or read_layer_plan("/nonexistent.prototxt")
