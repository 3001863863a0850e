"""Paleo's [max, sum] bounds on parallel branches, on GoogLeNet's inception modules from the nets zoo."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from firescale.model.comm import allreduce_time
from firescale.model.layers import branch_bounds, net_cost
from firescale.model.paleo import compute_times, firecaffe_platform, platform_cost, predict_point
from firescale.nets.spec import Branches, infer_shapes
from firescale.nets.zoo import get_net


def _by_hand(spec, seconds_by_name):
    """The lower bound walked from the spec by layer names: an inception module costs its slowest branch, then
    its concat.  GoogLeNet's branches hold no blocks of their own."""
    total = 0.0
    for layer in spec.layers:
        if isinstance(layer, Branches):
            total += max(sum(seconds_by_name[f"{layer.name}/{sub.name}"] for sub in branch)
                         for branch in layer.branches)
        total += seconds_by_name[layer.name]
    return total


def test_googlenet_iteration_is_bounded_by_its_slowest_branches_and_by_their_sum():
    spec, platform = get_net("googlenet"), firecaffe_platform()
    names = [rec.name for rec in infer_shapes(spec)]
    assert sum(isinstance(layer, Branches) for layer in spec.layers) == 9
    times = compute_times(platform_cost(platform, spec, 32), platform.device, elementwise=platform.elementwise)
    forward = dict(zip(names, times.layer_forward))
    backward = dict(zip(names, times.layer_backward))
    low_f, high_f = branch_bounds(spec, times.layer_forward)
    low_b, high_b = branch_bounds(spec, times.layer_backward)
    assert low_f == pytest.approx(_by_hand(spec, forward)) and low_b == pytest.approx(_by_hand(spec, backward))
    assert high_f == pytest.approx(times.forward) and high_b == pytest.approx(times.backward)
    assert low_f < 0.9 * high_f and low_b < 0.9 * high_b          # the bounds differ by a quarter

    one = predict_point(platform, spec, 1, 32)
    assert one.iteration_s == one.iteration_sequential_s == pytest.approx(high_f + high_b + times.update)
    assert one.iteration_sequential_lower_s == pytest.approx(low_f + low_b + times.update)
    # on 8 devices each computes a quarter of the batch, then the whole |W| is reduced in either bound
    eight = predict_point(platform, spec, 8, 256)
    comm = allreduce_time("tree", eight.gradient_bytes, 8, platform.link)
    assert eight.comm_s == pytest.approx(comm)
    assert eight.iteration_sequential_lower_s == pytest.approx(one.iteration_sequential_lower_s + comm)
    assert eight.iteration_sequential_s == pytest.approx(one.iteration_sequential_s + comm)


def test_a_net_without_branches_has_one_bound_and_an_identity_shortcut_costs_nothing():
    nin = predict_point(firecaffe_platform(), get_net("nin"), 4, 256)
    # one bound: equal to the last few bits (the two sum the same layers in other orders)
    assert nin.iteration_sequential_lower_s == pytest.approx(nin.iteration_sequential_s, rel=1e-12)
    resnet = get_net("resnet50")
    cost = net_cost(resnet, 1)
    flops = [layer.forward_flops for layer in cost.layers]
    low, high = branch_bounds(resnet, flops)
    by_name = dict(zip((rec.name for rec in infer_shapes(resnet)), flops))
    blocks = [layer for layer in resnet.layers if isinstance(layer, Branches)]
    assert all(len(block.branches) == 2 for block in blocks)
    # two branches: max(a, b) = a + b - min(a, b); an identity shortcut (a branch of no layers) saves nothing
    saved = [min(sum(by_name[f"{block.name}/{sub.name}"] for sub in branch) for branch in block.branches)
             for block in blocks]
    assert sum(s == 0 for s in saved) == 12 and sum(s > 0 for s in saved) == 4     # identity, projection
    assert high - low == pytest.approx(sum(saved)) and low < high
    with pytest.raises(ValueError, match="has 142 layers counting each branch's, not 3"):
        branch_bounds(get_net("googlenet"), [1.0, 2.0, 3.0])


def test_predict_paleo_and_predict_layers_show_both_bounds(repo, tmp_path):
    out = tmp_path / "layers.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "layers", "googlenet", "--batch", "32",
                           "--json", str(out)], capture_output=True, text=True, cwd=repo, timeout=120)
    assert proc.returncode == 0, proc.stderr
    totals = json.loads(out.read_text())["totals"]
    spec = get_net("googlenet")
    cost = net_cost(spec, 32)
    names = [rec.name for rec in infer_shapes(spec)]
    assert totals["forward_flops_branches_concurrent"] == pytest.approx(
        _by_hand(spec, dict(zip(names, (layer.forward_flops for layer in cost.layers)))))
    assert totals["forward_flops_branches_concurrent"] < totals["forward_flops"]
    assert "Paleo's lower bound" in proc.stdout
    out = tmp_path / "paleo.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "paleo", "--net", "googlenet",
                           "--json", str(out)], capture_output=True, text=True, cwd=repo, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "branches concurrent" in proc.stdout
    for row in json.loads(out.read_text())["rows"]:
        assert row["iteration_sequential_lower_s"] < row["iteration_sequential_s"] == row["iteration_s"]
