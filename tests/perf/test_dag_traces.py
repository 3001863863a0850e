"""The DAG model's schedule, trace files in Table VI's format, and replaying them."""
from __future__ import annotations

import pytest

from firescale.errors import FirescaleError
from firescale.model.comm import Link
from firescale.model.dag import dag_speedup, wait_free_schedule
from firescale.model.traces import LayerTrace, read_trace, replay_trace, retarget_comm, write_trace

# Table VI of Shi et al.: one iteration of AlexNet on K80 GPUs (µs, bytes).
TABLE_VI = """layer_id,name,forward_us,backward_us,comm_us,gradient_bytes
0,data,1.20e+06,0,0,0
1,conv1,3.27e+06,288202,123.424,139776
2,relu1,17234.5,27650.9,0,0
3,pool1,32175.7,60732.6,0,0
4,conv2,3.14e+06,1.03216e+06,292.032,1229824
5,relu2,11507.5,18422.5,0,0
6,pool2,19831.2,32459,0,0
7,conv3,3.886e+06,791825,288214,3540480
8,relu3,4770.3,10996.3,0,0
9,conv4,1.87e+06,510405,1.03218e+06,2655744
10,relu4,4760.26,7872.45,0,0
11,conv5,1.13e+06,306129,275772,1770496
12,relu5,3201.22,4939.42,0,0
13,pool5,5812,18666.2,0,0
14,fc6,44689.7,73935,311170,151011328
15,relu6,295.168,1092.83,0,0
16,drop6,359.744,131247,0,0
17,fc7,19787.8,34423.8,610376,67125248
18,relu7,295.04,451.904,0,0
19,drop7,358.048,317.312,0,0
20,fc8,8033.12,9922.72,130964,16388000
21,loss,1723.49,293.024,0,0
"""


def test_schedule_by_hand():
    # three layers, input first; backward runs 3, 2, 1; comm of layer 3 (3 units) overlaps layers 2 and 1
    s = wait_free_schedule([1, 1, 1], [2, 2, 2], [1, 0, 3], update=0.5)
    # forward ends at 3; b3 ends 5 -> c3 5..8; b2 ends 7; b1 ends 9 -> c1 9..10; update 10.5
    assert s.iteration == pytest.approx(10.5)
    assert s.comm_exposed == pytest.approx(1.0)
    plain = wait_free_schedule([1, 1, 1], [2, 2, 2], [1, 0, 3], update=0.5, overlap=False)
    assert plain.iteration == pytest.approx(13.5)
    # I/O overlapped with computation (Eq. 3) only matters when it is the longer path
    assert wait_free_schedule([1], [1], [0], io=5).iteration == 5
    assert wait_free_schedule([1], [1], [0], io=5, overlap_io=False).iteration == 7
    assert dag_speedup(2.0, 2.5, 4) == pytest.approx(3.2)


def test_table_vi_trace_round_trips_and_replays(tmp_path):
    src = tmp_path / "alexnet_k80.csv"
    src.write_text(TABLE_VI)
    trace = read_trace(src)
    assert len(trace) == 22 and trace[14].gradient_bytes == 151011328
    for suffix in (".json", ".csv"):
        again = read_trace(write_trace(tmp_path / f"copy{suffix}", trace))
        assert [r.name for r in again] == [r.name for r in trace]
        assert again[7].comm_us == pytest.approx(trace[7].comm_us, rel=1e-5)
    plain = replay_trace(trace, overlap=False)
    wfbp = replay_trace(trace, overlap=True)
    total_f = sum(r.forward_us for r in trace[1:])
    total_b = sum(r.backward_us for r in trace)
    total_c = sum(r.comm_us for r in trace)
    assert plain.iteration == pytest.approx(1.2e6 + total_f + total_b + total_c)   # naive S-SGD, Eq. 2
    assert total_f + total_b <= wfbp.iteration < plain.iteration


def test_retargeting_communication_to_more_gpus():
    trace = [LayerTrace(0, "conv", 100.0, 200.0, 0.0, 4_000_000), LayerTrace(1, "relu", 1.0, 1.0, 0.0, 0)]
    link = Link(1e9)
    t8 = retarget_comm(trace, "tree", 8, link)
    assert t8[0].comm_us == pytest.approx(2 * 3 * 4e6 / 1e9 * 1e6)
    assert t8[1].comm_us == 0.0


def test_bad_trace_files_are_named(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("layer_id,name,forward_us\n0,conv1,12\n")
    with pytest.raises(FirescaleError, match="bad.csv line 2: missing backward_us"):
        read_trace(bad)
    neg = tmp_path / "neg.json"
    neg.write_text('[{"layer_id": 0, "name": "a", "forward_us": -1, "backward_us": 0, "comm_us": 0, '
                   '"gradient_bytes": 0}]')
    with pytest.raises(FirescaleError, match="must not be negative"):
        read_trace(neg)


def test_trace_cli(repo, tmp_path):
    import subprocess
    import sys
    src = tmp_path / "t.csv"
    src.write_text(TABLE_VI)
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "trace", str(src), "--gpus", "1,4,16",
                           "--bandwidth-gbits", "10"], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "wait-free" in proc.stdout and len(proc.stdout.splitlines()) == 5
