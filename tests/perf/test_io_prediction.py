"""I/O in the prediction: t_io under a node's contention and the shared filesystem's, t_h2d, Eq. 3 against Eq. 1-2,
and both in `predict experiment` and the report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.model.io_time import DataPath, fetch_then_compute, h2d_time, io_time
from firescale.model.paleo import platform_from_site, predict_point
from firescale.report.summary import load_predictions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
from site_helpers import REPO, one_link, site_copy  # noqa: E402

IMAGE = 224 * 224 * 3   # bytes of one stored 224x224 RGB image


def test_ranks_of_one_node_share_its_read_bandwidth():
    path = DataPath(read_bandwidth=1e9)
    alone = io_time(32, IMAGE, 1, 4, path)
    assert alone == pytest.approx(32 * IMAGE / 1e9, rel=1e-12)
    assert io_time(32, IMAGE, 4, 4, path) == pytest.approx(4 * alone, rel=1e-12)   # Eq. 6's t_io of 4 per node
    assert io_time(32, IMAGE, 8, 4, path) == pytest.approx(4 * alone, rel=1e-12)   # two nodes, each its own


def test_the_shared_filesystem_bounds_the_read_once_it_serves_enough_nodes():
    path = DataPath(read_bandwidth=1e9, shared_read_bandwidth=1.5e9)
    assert io_time(32, IMAGE, 4, 4, path) == pytest.approx(4 * 32 * IMAGE / 1e9, rel=1e-12)      # node-bound
    assert io_time(32, IMAGE, 8, 4, path) == pytest.approx(8 * 32 * IMAGE / 1.5e9, rel=1e-12)    # filesystem-bound
    assert io_time(32, IMAGE, 8, 4, DataPath()) == 0.0


def test_host_to_device_copies_the_float32_input():
    assert h2d_time(32, (227, 227, 3), DataPath(h2d_bandwidth=12e9)) == pytest.approx(32 * 227 * 227 * 3 * 4 / 12e9)
    assert h2d_time(32, (227, 227, 3), DataPath()) == 0.0


def test_prefetching_takes_the_longer_reading_in_line_the_sum():
    assert fetch_then_compute(0.03, 0.01, 0.05, overlap_io=True) == 0.05
    assert fetch_then_compute(0.05, 0.01, 0.05, overlap_io=True) == pytest.approx(0.06)
    assert fetch_then_compute(0.03, 0.01, 0.05, overlap_io=False) == pytest.approx(0.09)


def test_bad_bandwidths_are_refused():
    with pytest.raises(FirescaleError, match="read_bandwidth must be a finite number"):
        DataPath(read_bandwidth=-1.0)


def _storage(d: dict) -> None:
    d["storage"] = {"read_gbytes_per_s": 0.3673, "shared_read_gbytes_per_s": 1.1}   # the DAG paper's SSD and NFS
    d["device"]["host_to_device_gbs"] = 12.0


def test_a_gpu_site_with_storage_predicts_io_and_copy_behind_the_compute(tmp_path):
    site = load_site(site_copy(tmp_path, "ib-cluster", _storage))
    platform = platform_from_site(site)
    # 10 cores a rank: a reader thread
    assert platform.data == DataPath(0.3673e9, 1.1e9, 12e9, overlap_io=True, read_source="site")
    p = predict_point(site, "alexnet", 8, 1024)
    batch = 1024 // 8
    stored = 227 * 227 * 3
    assert p.io_s == pytest.approx(max(4 * batch * stored / 0.3673e9, 8 * batch * stored / 1.1e9), rel=1e-12)
    assert p.h2d_s == pytest.approx(batch * stored * 4 / 12e9, rel=1e-12)
    work = p.forward_s + p.backward_s + p.update_s + p.comm_s
    assert p.iteration_sequential_s == pytest.approx(max(p.io_s + p.h2d_s, work) + p.cycle_wait_s, rel=1e-12)
    assert p.io_s + p.h2d_s > work     # V100s outrun the paper's SSD: Eq. 3 makes the iteration I/O-bound
    # The stored images may be larger than the net's input (a crop): t_io reads what is stored.
    bigger = predict_point(site, "alexnet", 8, 1024, image_bytes=256 * 256 * 3)
    assert bigger.io_s == pytest.approx(p.io_s * 256 * 256 / (227 * 227), rel=1e-12)


def test_a_one_core_rank_reads_in_line_so_io_adds_to_the_iteration(tmp_path):
    site = load_site(site_copy(tmp_path, "local", lambda d: d.update(storage={"read_gbytes_per_s": 0.5})))
    assert not platform_from_site(site).data.overlap_io
    with_io, without = predict_point(site, "lenet_same", 2, 64), predict_point(load_site("local"), "lenet_same", 2, 64)
    assert with_io.io_s == pytest.approx(2 * 32 * 28 * 28 / 0.5e9, rel=1e-12) and with_io.h2d_s == 0.0
    assert without.io_s == 0.0
    assert with_io.iteration_sequential_s - with_io.cycle_wait_s == pytest.approx(
        without.iteration_sequential_s - without.cycle_wait_s + with_io.io_s, rel=1e-12)


def test_report_carries_the_predicted_parts(tmp_path):
    path = tmp_path / "predict.json"
    path.write_text(json.dumps({"points": {"g8-b1024": {
        "gpus": 8, "batch": 1024, "iteration_s": 0.2, "time_to_accuracy_s": 100.0, "comm_intra_s": 0.001,
        "comm_inter_s": 0.02, "io_s": 0.05, "h2d_s": 0.003}}}))
    point = load_predictions(path)["g8-b1024"]
    assert point == {"iteration_s": 0.2, "time_to_accuracy_s": 100.0, "comm_intra_s": 0.001, "comm_inter_s": 0.02,
                     "io_s": 0.05, "h2d_s": 0.003}


def test_predict_experiment_gives_each_point_its_parts(tmp_path):
    from firescale.commands.predict_experiment import markdown_table
    from firescale.predict.experiment import predict_experiment
    from firescale.sweep.plan import load_plan

    def two_level(d: dict) -> None:
        _storage(d)
        d["interconnect"]["intra_node"] = {"name": "NVLink 2", "bandwidth_gbits": 1200, "latency_us": 2}
    plan = load_plan(site_copy(tmp_path, "ib-cluster", two_level), REPO / "workflow" / "config.yaml")
    result = predict_experiment(plan, "nin-imagenet")
    points = result["points"]
    assert result["model"]["platform"]["ranks_per_node"] == 4
    assert result["model"]["platform"]["intra_link_bandwidth"] == 150e9
    one_node = next(p for p in points.values() if p["gpus"] == 4)
    many = next(p for p in points.values() if p["gpus"] == 32)
    assert one_node["nodes"] == 1 and one_node["comm_inter_s"] == 0.0 < one_node["comm_intra_s"]
    assert many["nodes"] == 8 and many["comm_inter_s"] > 0.0
    assert many["comm_s"] == pytest.approx(many["comm_intra_s"] + many["comm_inter_s"], rel=1e-12)
    # NiN reads ImageNet's stored 224x224 crops (no manifest here: the net's input) over the shared NFS
    assert many["io_s"] == pytest.approx(32 * (many["batch"] // 32) * 224 * 224 * 3 / 1.1e9, rel=1e-12)
    assert "| comm intra + inter (ms) | I/O + H2D (ms) |" in markdown_table(result)


def test_a_calibrated_read_bandwidth_is_each_nodes_and_the_sites_own_key_wins(tmp_path):
    """`bench io` reads on one node: the calibrated bandwidth is B_io per node, each node its own; the
    shared filesystem's aggregate stays the site's key, and a site's own read_gbytes_per_s wins."""
    from firescale.predict.calibrate import Calibration, load_calibration, save_calibration

    cal = Calibration("ib-cluster", 0.5, 0.5, {}, {}, read_bandwidth=2e9, io_source={"format": "lmdb"})
    applied = cal.apply(platform_from_site(load_site(site_copy(tmp_path / "one", "ib-cluster", one_link))))
    assert applied.data.read_bandwidth == 2e9 and applied.data.shared_read_bandwidth == 0.0
    batch, stored = 1024 // 8, 227 * 227 * 3
    # Two nodes of 4: each node's 4 ranks share its 2 GB/s; the nodes do not share anything.
    assert predict_point(applied, "alexnet", 8, 1024).io_s == pytest.approx(4 * batch * stored / 2e9, rel=1e-12)
    shared_only = load_site(site_copy(tmp_path / "shared", "ib-cluster", lambda d: d.update(
        storage={"shared_read_gbytes_per_s": 1.1})))
    both = cal.apply(platform_from_site(shared_only)).data
    assert (both.read_bandwidth, both.shared_read_bandwidth) == (2e9, 1.1e9)
    sited = platform_from_site(load_site(site_copy(tmp_path / "sited", "ib-cluster", _storage)))
    assert cal.apply(sited).data == sited.data
    # The calibration file keeps it; a negative one is refused by name.
    path = save_calibration(tmp_path / "calibration.json", cal)
    assert load_calibration(path).read_bandwidth == 2e9 and load_calibration(path).io_source == {"format": "lmdb"}
    path.write_text(json.dumps({**json.loads(path.read_text()), "read_bandwidth": -1.0}))
    with pytest.raises(FirescaleError, match=r"calibration.json: read_bandwidth must be a number >= 0"):
        load_calibration(path)


def test_the_format_of_a_bench_io_record_is_the_trainers_unless_chosen(tmp_path):
    from firescale.predict.calibrate import read_bandwidth_measurement

    record = {"dataset": "d", "batch": 8, "readers": {"hdf5": {"raw_sequential": {"MB_per_s": 300.0}},
                                                      "lmdb": {"raw_sequential": {"MB_per_s": 200.0}}}}
    path = tmp_path / "bench-io.json"
    path.write_text(json.dumps(record))
    assert read_bandwidth_measurement(path)[0] == 200e6                       # LMDB, as the trainer reads
    assert read_bandwidth_measurement(path, "hdf5")[0] == 300e6
    del record["readers"]["lmdb"]
    path.write_text(json.dumps(record))
    assert read_bandwidth_measurement(path)[1]["format"] == "hdf5"            # its only format
    with pytest.raises(FirescaleError, match=r"bench-io.json: 'readers' has no 'lmdb'; it measured hdf5"):
        read_bandwidth_measurement(path, "lmdb")
