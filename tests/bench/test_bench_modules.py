"""The bench folder's shape, and the record its `bench allreduce --json` hands to a calibration."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from firescale.bench.against_mpi import framework_vs_mpi, record, table_lines
from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.errors import FirescaleError
from firescale.frameworks import PYTORCH, TENSORFLOW
from firescale.predict.calibrate import read_allreduce_record

BENCH = Path(__file__).resolve().parents[2] / "src" / "firescale" / "bench"


def test_no_module_of_bench_is_over_400_lines():
    lengths = {p.name: len(p.read_text().splitlines()) for p in BENCH.glob("*.py")}
    assert "allreduce_record.py" in lengths and "mpi_algorithms.py" in lengths
    assert {name: n for name, n in lengths.items() if n > 400} == {}


def test_a_measurement_goes_through_its_json_entry_and_back():
    m = AllreduceMeasurement("horovod", 2, 4000, [0.003, 0.001, 0.002], 0.004, 8, 0.0002,
                             overlapped_seconds=[0.001, 0.001, 0.001], window_s=0.003)
    entry = {**m.to_dict(), "predicted_s": 0.001, "predicted_by_model": {"ring": 0.001}}
    assert list(m.to_dict())[:3] == ["algorithm", "ranks", "bytes"] and entry["median_s"] == 0.002
    back = AllreduceMeasurement.from_dict(json.loads(json.dumps(entry)), "a.json: measurements[0]")
    assert back == m and back.hidden_share == pytest.approx(0.5)
    plain = AllreduceMeasurement("torch", 2, 4000, [0.001], process_group="gloo").to_dict()
    assert "overlapped_seconds" not in plain and "hidden_share" not in plain and plain["process_group"] == "gloo"
    assert "process_group" not in AllreduceMeasurement("mpi", 2, 4000, [0.001]).to_dict()


def test_a_record_without_its_repetitions_keeps_the_figures_it_states(tmp_path):
    """Records written by hand or before the repetitions were kept: the mean and fastest repetition are the
    median where they are not stated; a wrong kind of value is one sentence naming the file and the entry."""
    path = tmp_path / "ar.json"
    path.write_text(json.dumps({"measurements": [
        {"algorithm": "horovod", "ranks": 2, "bytes": 5e5, "median_s": 0.002, "compute_s": 0.01, "odd": 1},
        {"algorithm": "mpi", "ranks": 2, "bytes": 500000, "median_s": 0.001, "mean_s": 0.0012, "hidden_share": None}]}))
    stepped, mpi = read_allreduce_record(path)
    assert (stepped.bytes, stepped.mean_s, stepped.min_s, stepped.seconds) == (500000, 0.002, 0.002, [])
    assert (mpi.mean_s, mpi.min_s, mpi.hidden_share) == (0.0012, 0.001, None)
    path.write_text(json.dumps({"measurements": [{"algorithm": "mpi", "ranks": "2", "bytes": 1, "median_s": 0.1}]}))
    with pytest.raises(FirescaleError, match=r"ar\.json: measurements\[0\]: ranks must be a whole number, not '2'"):
        read_allreduce_record(path)
    with pytest.raises(FirescaleError, match="needs its repetitions' seconds or their median_s"):
        AllreduceMeasurement("mpi", 2, 4000)


def test_each_framework_is_set_beside_mpi_of_its_size_in_one_record_under_its_own_key():
    measured = [AllreduceMeasurement("mpi", 2, 1000, [0.001]), AllreduceMeasurement("mpi", 2, 2000, [0.002]),
                AllreduceMeasurement("horovod", 2, 2000, [0.004], graph_call_s=0.002),
                AllreduceMeasurement("horovod", 2, 1000, [0.002], graph_call_s=0.001),
                AllreduceMeasurement("torch", 2, 1000, [0.004], process_group="gloo"),
                AllreduceMeasurement("torch", 2, 1000, [0.002], process_group="mpi"),
                AllreduceMeasurement("torch", 2, 9000, [0.002], process_group="mpi")]   # no MPI of its size
    pairs = framework_vs_mpi(measured)
    assert [(p.framework.name, p.bytes, p.process_group) for p in pairs] == [
        ("tensorflow", 1000, ""), ("pytorch", 1000, "gloo"), ("pytorch", 1000, "mpi"), ("tensorflow", 2000, "")]
    assert pairs[0].percent_of_mpi == pytest.approx(50) and pairs[0].in_graph_percent_of_mpi == pytest.approx(100)
    kept = record(pairs)
    assert set(kept) == {f"{TENSORFLOW.algorithm}_vs_mpi", f"{PYTORCH.algorithm}_vs_mpi"}
    assert list(kept["horovod_vs_mpi"][0]) == ["bytes", "ranks", "mpi_s", "horovod_s", "mpi_min_s", "horovod_min_s",
                                               "graph_call_s", "percent_of_mpi", "best_percent_of_mpi",
                                               "in_graph_percent_of_mpi"]
    assert list(kept["torch_vs_mpi"][0]) == ["bytes", "ranks", "mpi_s", "torch_s", "mpi_min_s", "torch_min_s",
                                             "process_group", "percent_of_mpi", "best_percent_of_mpi"]
    lines = table_lines(pairs)
    assert sum("Horovod % of MPI rate" in line for line in lines) == 1
    assert sum("torch.distributed % of MPI rate" in line for line in lines) == 1
    assert [line.split()[:2] for line in lines if line.split()[1:2] in (["gloo"], ["mpi"])] == [["1", "gloo"],
                                                                                                 ["1", "mpi"]]
    assert record(framework_vs_mpi(measured[:2])) == {"horovod_vs_mpi": [], "torch_vs_mpi": []}
