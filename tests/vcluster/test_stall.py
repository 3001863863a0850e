"""A stall on the virtual cluster: a 2-node PyTorch job (one rank a node, summing over the MPI group, which has no
timeout of its own) whose rank on n2 is stopped (SIGSTOP) is found by its heartbeat within stall_after and a poll,
cancelled through the cluster's Slurm, recorded STALLED with the rank and host that stopped, resubmitted from its
snapshot and finished, no iteration trained twice; and a job whose iterations take ten times their predicted time,
but come, is left alone."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from firescale.cluster.site import load_site
from firescale.jobs.heartbeat import read_beats
from firescale.jobs.outcome import ResubmitRules
from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler, prefixed
from firescale.jobs.spec import JobSpec
from firescale.jobs.stall import StallWatch, default_stall_after
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vcluster, pytest.mark.pytorch, pytest.mark.slow]

RANK_BYTES = 16 * 8 * 8      # 16 digits of 8 x 8 bytes a rank an iteration
RANK_ENV = {"PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1", "FIRESCALE_HEARTBEAT_SECONDS": "0.5"}
POLL = 1.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vc-stall-data")
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(root)],
                   check=True, capture_output=True)
    return root / "digits"


def _site(tmp_path: Path, cluster):
    data = yaml.safe_load((REPO / "site" / "vcluster" / "site.yaml").read_text())
    data.update(client_prefix=[str(cluster.enter), "ctl"])
    data["environment"]["venv"] = str(Path(sys.executable).parent.parent)
    path = tmp_path / "vcluster" / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return load_site(path)


def _run(tmp_path: Path, cluster, digits: Path, max_iter: int, iteration_s: float, stall_after: float,
         log) -> PointRun:
    site = _site(tmp_path, cluster)
    run = tmp_path / "run"
    command = [sys.executable, "-m", "firescale", "train", "--dataset", str(digits), "--net", "lenet_same",
               "--solver", str(REPO / "workflow" / "solvers" / "lenet-digits.yaml"), "--framework", "pytorch",
               "--total-batch", "32", "--set", f"max_iter={max_iter}", "--set", f"test_interval={max_iter // 2}",
               "--set", "snapshot=20", "--set", "display=20", "--out", str(run), "--resume",
               "--read-limit-mbs", f"{RANK_BYTES / iteration_s / 1e6:.10g}"]
    job = JobSpec(name="fs-vc-stall", ranks=2, walltime_s=900, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=command, framework="pytorch", env=RANK_ENV)
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job))
    return PointRun(scheduler=get_scheduler("slurm", prefixed(site.config["client_prefix"])), script=script,
                    run_dir=run, max_resubmits=2, log=log, rules=ResubmitRules.for_site(site, "00:15:00", "pytorch"),
                    polling=Polling(first=POLL, factor=1.0, most=POLL, status_wait=30),
                    stall=StallWatch(run, stall_after))


def test_a_rank_stopped_on_the_second_node_is_found_cancelled_and_resumed_from_its_snapshot(tmp_path, vcluster,
                                                                                           digits):
    stall_after, max_iter = 5.0, 120
    lines: list[tuple[float, str]] = []
    point = _run(tmp_path, vcluster, digits, max_iter, 0.1, stall_after,
                 lambda line: lines.append((time.monotonic(), line)))
    run = point.run_dir
    stopped: dict = {}

    def stop_the_rank_on_n2() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            beats = read_beats(run)
            if len(beats) == 2 and all(b.phase == "train" and b.iteration >= 30 for b in beats.values()):
                on_n2 = next(b for b in beats.values() if b.host == "n2")
                stopped.update(rank=on_n2.rank, pid=on_n2.pid)
                os.kill(on_n2.pid, signal.SIGSTOP)
                stopped["at"] = time.monotonic()
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_the_rank_on_n2, daemon=True)
    stopper.start()
    try:
        verdict, subs = point.run()
    finally:
        stopper.join(timeout=1)
        if "pid" in stopped:
            try:
                os.kill(stopped["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    log = (run / "job.log").read_text() if (run / "job.log").exists() else ""
    text = "\n".join(line for _, line in lines) + "\n" + log[-4000:]
    assert "at" in stopped, "the ranks never trained past iteration 30 on both nodes\n" + text
    assert verdict.outcome == "succeeded" and len(subs) == 2, text
    first = subs[0]
    assert first.state == "STALLED" and first.stall is not None, text
    where = first.stall["stopped"]
    assert [(r["rank"], r["host"], r["pid"]) for r in where] == [(stopped["rank"], "n2", stopped["pid"])], first.stall
    assert [r["host"] for r in first.stall["waiting"]] == ["n1"], first.stall
    assert f"rank {stopped['rank']} on n2 stopped beating" in text
    assert where[0]["silent_s"] <= stall_after + POLL + 0.5, first.stall
    found = next(t for t, line in lines if ": STALLED: " in line)
    assert found - stopped["at"] <= stall_after + 2 * POLL + 1.0, (found - stopped["at"], text)
    resumed_at = int(next(line for _, line in lines if "resubmitting from the snapshot at iteration" in line)
                     .split("resubmitting from the snapshot at iteration ")[1].split(":")[0])
    result = json.loads((run / "result.json").read_text())
    segments = result["segments"]
    assert result["iterations"] == max_iter and [(s["start_iter"], s["end_iter"]) for s in segments] == \
        [(0, resumed_at), (resumed_at, max_iter)], segments
    assert resumed_at >= 20 and sorted(result["hostnames"]) == ["n1", "n2"]
    record = collect(PointRecord(site="vcluster", experiment="e", point="g2-b32-r0", gpus=2, nodes=2, batch=32,
                                 lr=0.05, repeat=0, baseline=False, walltime="00:15:00", run_dir=str(run),
                                 max_resubmits=2, framework="pytorch"),
                     verdict, subs, run, tmp_path / "out" / "result.json", tmp_path / "out" / "status.json")
    assert record["outcome"] == "succeeded" and record["submissions"][0]["state"] == "STALLED"
    assert record["submissions"][0]["stall"]["stopped"][0]["host"] == "n2"


def test_a_job_ten_times_slower_than_predicted_that_progresses_is_left_alone(tmp_path, vcluster, digits):
    # predicted 0.1 s an iteration, 32 batches a read: 12 reads of them, 38.4 s, is the point's stall_after; each
    # takes 1 s, and they come 32 at a time (32 batches a read), 32 s apart
    stall_after = default_stall_after({"iteration_s": 0.1, "evaluations": 0, "batches_per_read": 32}, floor_s=1.0)
    assert stall_after == pytest.approx(38.4)
    lines: list[str] = []
    point = _run(tmp_path, vcluster, digits, 16, 1.0, stall_after, lines.append)
    verdict, subs = point.run()
    text = "\n".join(lines)
    assert verdict.outcome == "succeeded" and [s.state for s in subs] == ["COMPLETED"], text
    assert "STALLED" not in text
    result = json.loads((point.run_dir / "result.json").read_text())
    assert result["iterations"] == 16 and len(result["segments"]) == 1
    assert result["per_iteration"]["data_wait_s"] >= 1.0 * 0.99
