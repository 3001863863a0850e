"""`predict trace`'s two columns: naive S-SGD (the DAG paper's Eq. 2) and wait-free backprop (Eq. 5)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from firescale.model.dag import wait_free_schedule
from firescale.model.traces import LayerTrace, read_trace, replay_trace, write_trace

# A reader slower than the computation: overlapped, the I/O is the whole iteration; in series, it adds.
SLOW_READ = [LayerTrace(0, "data", 900.0, 0.0, 0.0, 0),
             LayerTrace(1, "conv", 100.0, 200.0, 50.0, 1000),
             LayerTrace(2, "fc", 50.0, 100.0, 150.0, 4000)]
COMPUTE, COMM = 100 + 200 + 50 + 100, 50 + 150


def test_the_no_overlap_schedule_is_naive_ssgd_with_io_in_series():
    naive = replay_trace(SLOW_READ, overlap=False, h2d_us=30.0, update_us=20.0)
    # Eq. 2: t_io + t_h2d + sum t_f + sum t_b + sum t_c + t_u
    assert naive.iteration == pytest.approx(900 + 30 + COMPUTE + COMM + 20)
    assert naive.io == 900 and naive.h2d == 30 and naive.comm_exposed == COMM
    wait_free = replay_trace(SLOW_READ, overlap=True, h2d_us=30.0, update_us=20.0)
    assert wait_free.iteration == pytest.approx(930)            # Eq. 5: max{t_io + t_h2d, ...}
    by_hand = wait_free_schedule([1], [1], [1], io=5, h2d=2, update=1, overlap=False, overlap_io=False)
    assert by_hand.iteration == 5 + 2 + 1 + 1 + 1 + 1


def test_an_exposed_data_wait_is_added_in_series_and_never_hidden_again(tmp_path):
    trace = [LayerTrace(0, "data_wait", 400.0, 0.0, 0.0, 0), *SLOW_READ[1:]]
    again = read_trace(write_trace(tmp_path / "t.csv", trace))
    assert again[0].name == "data_wait"
    wait_free = replay_trace(again, overlap=True)
    naive = replay_trace(again, overlap=False)
    assert wait_free.data_wait == naive.data_wait == 400 and wait_free.io == naive.io == 0
    assert naive.iteration == pytest.approx(400 + COMPUTE + COMM)
    # fc's gradient (150) goes while conv's backward (200) runs, conv's (50) after it
    assert wait_free.iteration == pytest.approx(400 + 150 + 300 + 50)
    # an I/O task given beside it is still overlapped; the measured wait stays in series
    assert replay_trace(again, overlap=True, io_us=2000.0).iteration == pytest.approx(400 + 2000)


def test_the_trace_command_prints_eq2_as_its_no_overlap_column(repo, tmp_path):
    src = tmp_path / "slow_read.csv"
    write_trace(src, SLOW_READ)
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "trace", str(src), "--update-us", "20",
                           "--json", str(out)], capture_output=True, text=True, cwd=repo, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["no_overlap"]["iteration"] == pytest.approx(900 + COMPUTE + COMM + 20)
    assert row["wait_free"]["iteration"] == pytest.approx(900)
    cells = proc.stdout.splitlines()[-1].split()
    assert float(cells[4]) == pytest.approx((900 + COMPUTE + COMM + 20) / 1e3)
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "trace", str(src), "--io-us", "-5"],
                          capture_output=True, text=True, cwd=repo, timeout=120)
    assert proc.returncode == 1 and "--io-us must be a time of 0 µs or more, not -5.0" in proc.stderr
