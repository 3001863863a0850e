"""Paleo's AlexNet case (nets/alex_v2_1gpu.json on K20s): its own code's step and Table 2's 402 ms within 3%."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from firescale.model.comm import allreduce_time
from firescale.model.paleo import (
    PALEO_TABLE2_ALEXNET_STEP_S,
    alexnet_case_platform,
    compute_times,
    paleo_alexnet,
    paleo_alexnet_1gpu,
    platform_cost,
    predict_point,
)

# What Paleo's code printed; the commands, the patch and the net's difference are under "provenance".
PALEO = json.loads((Path(__file__).parent / "data" / "paleo_alexnet_1gpu.json").read_text())
BATCH = PALEO["settings"]["batch_per_gpu"]
TOLERANCE = 0.03


def _paleo_step_ms() -> float:
    """Paleo's step: forward, backward, update and tree allreduce of both rows of its hybrid split."""
    columns = PALEO["step_ms"]["columns"]
    rows = [dict(zip(columns, values)) for values in PALEO["step_ms"]["rows"]]
    assert [r["workers"] for r in rows] == [1, 1] and {r["batch_size"] for r in rows} == {BATCH}
    return sum(r[c] for r in rows for c in ("fwd_time", "bwd_time", "apply_time", "sync_time(tree)"))


def test_the_1gpu_net_is_paleos_file_layer_by_layer():
    platform = alexnet_case_platform()
    cost = platform_cost(platform, paleo_alexnet_1gpu(), BATCH)
    ours = [l for l in cost.layers if l.kind != "relu"]
    paleo = PALEO["per_layer_ms"]["layers"]
    assert len(ours) == len(paleo)
    for layer, theirs in zip(ours, paleo):
        assert list(layer.output_shape) == [1] * (3 - len(theirs["output"])) + theirs["output"], (layer, theirs)
        assert layer.params == theirs["params"], (layer.name, theirs)
        if theirs["type"] != "softmax":
            assert layer.name == theirs["name"]
    assert cost.weight_bytes == PALEO["params_in_bytes"]
    # It is not alex_v2.json: conv4 has 256 filters where paleo_alexnet() has 384.
    assert platform_cost(platform, paleo_alexnet(), BATCH).weight_bytes > cost.weight_bytes


def test_every_layer_within_3_percent_of_paleos_code():
    platform = alexnet_case_platform()
    cost = platform_cost(platform, paleo_alexnet_1gpu(), BATCH)
    times = compute_times(cost, platform.device, elementwise=platform.elementwise)
    ours = [(l.name, f * 1e3, b * 1e3) for l, f, b in zip(cost.layers, times.layer_forward, times.layer_backward)
            if l.kind != "relu"]
    paleo = PALEO["per_layer_ms"]
    for (name, fwd, bwd), pf, pb in zip(ours, paleo["forward_ms"], paleo["backward_ms"], strict=True):
        assert fwd == pytest.approx(pf, rel=TOLERANCE), (name, "forward")
        assert bwd == pytest.approx(pb, rel=TOLERANCE), (name, "backward")


def test_one_step_within_3_percent_of_paleos_code_and_of_table2():
    pred = predict_point(alexnet_case_platform(), paleo_alexnet_1gpu(), 1, BATCH)
    one = dict(zip(PALEO["weak_ms"]["columns"], PALEO["weak_ms"]["rows"][0]))
    assert one["workers"] == 1 and one["batch_size"] == BATCH
    for ours_s, key in ((pred.forward_s, "time_fwd"), (pred.backward_s, "time_bwd"), (pred.update_s, "time_apply")):
        assert ours_s * 1e3 == pytest.approx(one[key], rel=TOLERANCE), key
    assert pred.comm_s == 0.0
    # 413.59 ms from Paleo's code; Table 2 publishes 402 ms (+2.9%).
    assert pred.iteration_s * 1e3 == pytest.approx(_paleo_step_ms(), rel=TOLERANCE)
    assert pred.iteration_s == pytest.approx(PALEO_TABLE2_ALEXNET_STEP_S, rel=TOLERANCE)


def test_data_parallel_on_1_to_8_k20s_within_3_percent_of_paleos_code():
    platform = alexnet_case_platform()
    spec = paleo_alexnet_1gpu()
    columns = PALEO["weak_ms"]["columns"]
    rows = [dict(zip(columns, values)) for values in PALEO["weak_ms"]["rows"]]
    assert [r["workers"] for r in rows] == [1, 2, 4, 8]
    for row in rows:
        w = row["workers"]
        pred = predict_point(platform, spec, w, BATCH, scaling="weak")
        assert pred.batch == row["batch_size"] and pred.batch_per_gpu == BATCH
        nbytes = pred.gradient_bytes
        pairs = {"time_comp": pred.forward_s + pred.backward_s + pred.update_s, "TreeAllReduce": pred.comm_s,
                 "OneToAll": allreduce_time("ps", nbytes, w, platform.link),
                 "ButterflyAllReduce": allreduce_time("butterfly", nbytes, w, platform.link)}
        for key, ours_s in pairs.items():
            assert ours_s * 1e3 == pytest.approx(row[key], rel=TOLERANCE), (key, w)
        assert pred.iteration_s * 1e3 == pytest.approx(row["time_comp"] + row["TreeAllReduce"], rel=TOLERANCE), w
