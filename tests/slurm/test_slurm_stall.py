"""Stalls under a real Slurm: a 2-rank PyTorch job (the MPI process group, which has no timeout of its own) with
one rank stopped (SIGSTOP) is found by its heartbeat within stall_after and a poll, cancelled, recorded STALLED,
resubmitted and resumed from its snapshot, and finishes without training an iteration twice; a job whose
iterations take ten times their predicted time, but come, is left alone (`firescale sweep run` as the workflow
runs it, stall_after from the prediction)."""
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
from slurm_site import REPO, slurm_here

from firescale.jobs.heartbeat import read_beats
from firescale.jobs.outcome import ResubmitRules
from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.spec import JobSpec
from firescale.jobs.stall import StallWatch
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect

pytestmark = [pytest.mark.slurm, pytest.mark.pytorch, pytest.mark.slow]

# Each rank reads 16 digits of 8 x 8 bytes an iteration: at this limit an iteration takes at least 0.1 s, asleep.
RANK_BYTES = 16 * 8 * 8
RANK_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1",
            "FIRESCALE_HEARTBEAT_SECONDS": "0.5"}
STALL_AFTER = 4.0
POLL = 1.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stall-data")
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(root)],
                   check=True, capture_output=True)
    return root / "digits"


def _train(digits: Path, out: Path, max_iter: int, iteration_s: float) -> list[str]:
    return [sys.executable, "-m", "firescale", "train", "--dataset", str(digits), "--net", "lenet_same",
            "--solver", str(REPO / "workflow" / "solvers" / "lenet-digits.yaml"), "--framework", "pytorch",
            "--total-batch", "32", "--set", f"max_iter={max_iter}", "--set", f"test_interval={max_iter // 2}",
            "--set", "snapshot=20", "--set", "display=20", "--out", str(out), "--resume",
            "--read-limit-mbs", f"{RANK_BYTES / iteration_s / 1e6:.10g}"]


def _script(tmp_path: Path, site, command: list[str]) -> Path:
    run = tmp_path / "run"
    job = JobSpec(name="fs-stall", ranks=2, walltime_s=600, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=command, framework="pytorch",
                  env={"PYTHONPATH": str(REPO / "src"), **RANK_ENV})
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job))
    return script


def _point(run: Path, max_iter: int) -> PointRecord:
    return PointRecord(site="slurm-here", experiment="e", point="g2-b32-r0", gpus=2, nodes=1, batch=32, lr=0.05,
                       repeat=0, baseline=False, walltime="00:10:00", run_dir=str(run), max_resubmits=2,
                       framework="pytorch")


def test_a_stopped_rank_is_found_cancelled_recorded_stalled_and_resumed_from_its_snapshot(tmp_path, monkeypatch,
                                                                                         slurm, digits):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    site = slurm_here(tmp_path)
    run = tmp_path / "run"
    max_iter = 120
    script = _script(tmp_path, site, _train(digits, run, max_iter, iteration_s=0.1))
    lines: list[tuple[float, str]] = []
    stopped: dict[str, float] = {}
    point = PointRun(scheduler=get_scheduler("slurm"), script=script, run_dir=run, max_resubmits=2,
                     log=lambda line: lines.append((time.monotonic(), line)),
                     rules=ResubmitRules.for_site(site, "00:10:00", "pytorch"),
                     polling=Polling(first=POLL, factor=1.0, most=POLL, status_wait=30),
                     stall=StallWatch(run, STALL_AFTER))

    def stop_rank_1() -> None:
        """Once both ranks train past the snapshot at iteration 20, rank 1 is stopped as a hung process is."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not stopped:
            beats = read_beats(run)
            if len(beats) == 2 and all(b.phase == "train" and b.iteration >= 30 for b in beats.values()):
                stopped["pid"] = beats[1].pid
                os.kill(beats[1].pid, signal.SIGSTOP)
                stopped["at"] = time.monotonic()
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_rank_1, daemon=True)
    stopper.start()
    try:
        verdict, subs = point.run()
    finally:
        stopper.join(timeout=1)
        if "pid" in stopped:
            try:
                os.kill(stopped["pid"], signal.SIGKILL)   # gone with its job already, unless the test failed early
            except ProcessLookupError:
                pass
    text = "\n".join(line for _, line in lines) + "\n" + (run / "job.log").read_text()[-4000:]
    assert "at" in stopped, "the ranks never trained past iteration 30\n" + text
    assert verdict.outcome == "succeeded" and len(subs) == 2, text
    first = subs[0]
    assert first.state == "STALLED" and first.stall is not None, text
    assert [r["rank"] for r in first.stall["stopped"]] == [1] and first.stall["stopped"][0]["pid"] == stopped["pid"]
    # rank 0 waits in MPI_Allreduce, alive: its heartbeat thread beats on (mpi4py lets go of the GIL)
    assert [r["rank"] for r in first.stall["waiting"]] == [0], first.stall
    assert first.stall["last_iteration"] >= 30
    assert "rank 1 on " in first.stall["stopped"][0]["where"] and "stopped beating" in text
    assert "could NOT be cancelled" not in text
    # found within stall_after and one poll of the runner's last sight of rank 1's heartbeat; from the stop, one
    # more poll (the last sight came at most a poll after the last beat) and a second for the machine's load
    assert first.stall["stopped"][0]["silent_s"] <= STALL_AFTER + POLL + 0.5, first.stall
    found = next(t for t, line in lines if ": STALLED: " in line)
    assert found - stopped["at"] <= STALL_AFTER + 2 * POLL + 1.0, (found - stopped["at"], text)
    # resubmitted from the newest snapshot, which the resumed run started from: no iteration trained twice
    resumed_at = int(next(line for _, line in lines if "resubmitting from the snapshot at iteration" in line)
                     .split("resubmitting from the snapshot at iteration ")[1].split(":")[0])
    assert resumed_at >= 20
    result = json.loads((run / "result.json").read_text())
    segments = result["segments"]
    assert result["iterations"] == max_iter and len(segments) == 2, segments
    assert segments[0]["start_iter"] == 0 and segments[0]["end_iter"] == resumed_at == segments[1]["start_iter"]
    assert segments[1]["end_iter"] == max_iter
    assert f"at iteration {resumed_at}" in (run / "job.log").read_text().split("resuming from")[-1].splitlines()[0]
    record = collect(_point(run, max_iter), verdict, subs, run, tmp_path / "out" / "result.json",
                     tmp_path / "out" / "status.json")
    assert record["outcome"] == "succeeded" and record["submissions"][0]["state"] == "STALLED"
    assert record["submissions"][0]["stall"]["stopped"][0]["rank"] == 1


def test_a_job_ten_times_slower_than_predicted_that_progresses_is_left_alone(tmp_path, monkeypatch, slurm, digits):
    """`firescale sweep run --prediction`: predicted 0.1 s an iteration and 32 batches a read, so stall_after is
    12 reads of them (38.4 s; the site's floor is 1 s here); each iteration takes at least 1 s, ten times the
    prediction, and they come 32 at a time (the trainer reads 32 batches in one go: 32 s apart)."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    data = slurm_here(tmp_path).config
    site = slurm_here(tmp_path, limits={k: v for k, v in {**data["limits"], "stall_after_floor": 1}.items()
                                        if k != "stall_after"})
    run = tmp_path / "run"
    max_iter = 16
    script = _script(tmp_path, site, _train(digits, run, max_iter, iteration_s=1.0))
    point_file = tmp_path / "point.json"
    _point(run, max_iter).write(point_file)
    prediction = tmp_path / "predict.json"
    prediction.write_text(json.dumps({"points": {"g2-b32-r0": {"iteration_s": 0.1, "evaluation_s": 0.0,
                                                              "evaluations": 2, "batches_per_read": 32}}}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "firescale", "sweep", "run", str(site.source), "--script", str(script),
                           "--point-file", str(point_file), "--prediction", str(prediction), "--poll-seconds", "1",
                           "--collect", str(out / "result.json"), str(out / "status.json")],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "stall_after 38.4 s (from the prediction: iterations of 0.1 s; at least 1 s)" in text, text
    record = json.loads((out / "result.json").read_text())
    assert record["outcome"] == "succeeded", text
    assert [s["state"] for s in record["submissions"]] == ["COMPLETED"] and "STALLED" not in text, text
    train = record["train"]
    assert train["iterations"] == max_iter and len(train["segments"]) == 1
    assert train["per_iteration"]["data_wait_s"] >= 1.0 * 0.99   # ten times the prediction, at least
