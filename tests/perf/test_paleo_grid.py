"""Paleo's own code over a grid of nets, per-GPU batches and worker counts: every layer and total within 3%."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from firescale.model.comm import allreduce_time
from firescale.model.paleo import (
    compute_times,
    firecaffe_platform,
    paleo_alexnet,
    paleo_nin,
    platform_cost,
    predict_point,
)
from firescale.nets.zoo import get_net

GRID = json.loads((Path(__file__).parent / "data" / "paleo_grid.json").read_text())
SPECS = {"nin": paleo_nin, "alexnet": paleo_alexnet, "googlenet": lambda: get_net("googlenet")}
KINDS = {"conv2d": "conv", "innerproduct": "fc", "pool2d": "pool", "dropout": "dropout", "softmax": "softmax",
         "concat": "concat", "generic_LRN": "lrn"}
TOLERANCE = 0.03


def _off(ours_ms: float, paleo_ms: float) -> float:
    """Relative error; a time Paleo gives as 0 must be 0 here too."""
    if paleo_ms == 0:
        return 0.0 if ours_ms == 0 else float("inf")
    return abs(ours_ms - paleo_ms) / paleo_ms


def _our_layers(net: str, batch: int) -> list[tuple[str, str, tuple[int, int, int], float, float]]:
    """(name, kind, output shape, forward ms, backward ms) per layer Paleo lists (activations are not)."""
    platform = firecaffe_platform()
    cost = platform_cost(platform, SPECS[net](), batch)
    times = compute_times(cost, platform.device, elementwise=platform.elementwise)
    return [(l.name, l.kind, l.output_shape, f * 1e3, b * 1e3)
            for l, f, b in zip(cost.layers, times.layer_forward, times.layer_backward) if l.kind != "relu"]


def test_the_grid_covers_small_per_gpu_batches_and_many_workers():
    assert GRID["provenance"]["commit"].startswith("984bbf5")
    for entry in GRID["nets"].values():
        rows = entry["totals_ms"]["rows"]
        assert len(rows) == 7 * 8
        assert {r[0] for r in rows} == {1, 2, 4, 8, 16, 32, 64}          # images per GPU
        assert {r[1] for r in rows} == {1, 2, 4, 8, 16, 32, 64, 128}     # workers


@pytest.mark.parametrize("net", sorted(GRID["nets"]))
def test_every_layer_within_3_percent_of_paleo_at_every_per_gpu_batch(net):
    entry = GRID["nets"][net]
    worst: list[tuple[float, str]] = []
    for batch, paleo in entry["per_layer_ms"].items():
        ours = _our_layers(net, int(batch))
        assert len(ours) == len(entry["layers"]), f"{net}: {len(ours)} layers here, {len(entry['layers'])} in Paleo"
        for (name, kind, shape, fwd, bwd), layer, pf, pb in zip(ours, entry["layers"], paleo["forward_ms"],
                                                                  paleo["backward_ms"]):
            # the same layer on both sides: its kind and its output shape
            assert kind == KINDS[layer["type"]], (net, name, layer)
            assert list(shape) == [1] * (3 - len(layer["output"])) + layer["output"], (net, name, layer)
            for direction, a, p in (("forward", fwd, pf), ("backward", bwd, pb)):
                worst.append((_off(a, p), f"{net} {name} {direction} at {batch} images/GPU: {a:.6g} ms, "
                                          f"Paleo {p:.6g} ms"))
    worst.sort(reverse=True)
    assert worst[0][0] <= TOLERANCE, "; ".join(msg for err, msg in worst[:5] if err > TOLERANCE)


@pytest.mark.parametrize("net", sorted(GRID["nets"]))
def test_every_total_within_3_percent_of_paleo_at_every_grid_point(net):
    entry = GRID["nets"][net]
    columns = entry["totals_ms"]["columns"]
    platform = firecaffe_platform()
    spec = SPECS[net]()
    worst: list[tuple[float, str]] = []
    for values in entry["totals_ms"]["rows"]:
        row = dict(zip(columns, values))
        b, w = row["batch_per_gpu"], row["workers"]
        pred = predict_point(platform, spec, w, row["batch_size"])
        assert pred.batch_per_gpu == b
        nbytes = pred.gradient_bytes
        assert nbytes == entry["params_in_bytes"]
        pairs = {"time_fwd": pred.forward_s, "time_bwd": pred.backward_s, "time_apply": pred.update_s,
                 "time_comp": pred.forward_s + pred.backward_s + pred.update_s,
                 "TreeAllReduce": pred.comm_s,
                 "OneToAll": allreduce_time("ps", nbytes, w, platform.link),
                 "ButterflyAllReduce": allreduce_time("butterfly", nbytes, w, platform.link)}
        for key, ours_s in pairs.items():
            worst.append((_off(ours_s * 1e3, row[key]), f"{net} {key} at {b} images/GPU x {w}: "
                                                         f"{ours_s * 1e3:.6g} ms, Paleo {row[key]:.6g} ms"))
        paleo_iteration = row["time_comp"] + row["TreeAllReduce"]
        worst.append((_off(pred.iteration_s * 1e3, paleo_iteration),
                      f"{net} iteration at {b} images/GPU x {w}: {pred.iteration_s * 1e3:.6g} ms, "
                      f"Paleo {paleo_iteration:.6g} ms"))
    worst.sort(reverse=True)
    assert worst[0][0] <= TOLERANCE, "; ".join(msg for err, msg in worst[:5] if err > TOLERANCE)
