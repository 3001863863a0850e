"""A node lost mid-run on the virtual cluster: its rank killed, or the whole node (slurmd and all) gone.
The point fails with the scheduler's or the job's reason, is not resubmitted, and its record says so."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from firescale.cluster.site import load_site
from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler, prefixed
from firescale.jobs.spec import JobSpec
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect
from firescale.testing.namespaces import processes_in

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vcluster, pytest.mark.tensorflow]   # the ranks allreduce with Horovod

# Two ranks that allreduce for up to two minutes; each says when it is under way.
RANK_CODE = """\
import os, time
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
x = tf.ones([1 << 16])
hvd.allreduce(x)
open(f"ready-{hvd.rank()}", "w").write(str(os.getpid()))
end = time.time() + 120
while time.time() < end:
    hvd.allreduce(x)
    time.sleep(0.05)
"""


def _site(tmp_path: Path, cluster):
    data = yaml.safe_load((REPO / "site" / "vcluster" / "site.yaml").read_text())
    data.update(client_prefix=[str(cluster.enter), "ctl"])
    data["environment"]["venv"] = str(Path(sys.executable).parent.parent)
    path = tmp_path / "vcluster" / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return load_site(path)


def _start(tmp_path: Path, cluster):
    site = _site(tmp_path, cluster)
    run = tmp_path / "run"
    job = JobSpec(name="fs-node-loss", ranks=2, walltime_s=600, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=["python", "-c", RANK_CODE])
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job))
    lines: list[str] = []
    point_run = PointRun(scheduler=get_scheduler("slurm", prefixed(site.config["client_prefix"])), script=script,
                         run_dir=run, max_resubmits=2, log=lines.append,
                         polling=Polling(first=0.5, factor=1.5, most=2, status_wait=20))
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(zip(("verdict", "subs"), point_run.run())))
    thread.start()
    deadline = time.monotonic() + 120
    while not all((run / f"ready-{r}").exists() for r in range(2)):
        assert thread.is_alive() and time.monotonic() < deadline, "the ranks never started\n" + "\n".join(lines)
        time.sleep(0.2)
    return thread, outcome, run, lines


def _finish(thread, outcome, run, lines):
    thread.join(timeout=180)
    assert not thread.is_alive(), "the runner did not decide\n" + "\n".join(lines)
    log = (run / "job.log").read_text() if (run / "job.log").exists() else ""
    return outcome["verdict"], outcome["subs"], "\n".join(lines) + "\n" + log


def _record(tmp_path, verdict, subs, run):
    point = PointRecord(site="vcluster", experiment="e", point="g2-b64-r0", gpus=2, nodes=2, batch=64, lr=0.05,
                        repeat=0, baseline=False, walltime="00:15:00", run_dir=str(run), max_resubmits=0)
    return collect(point, verdict, subs, run, tmp_path / "out" / "result.json", tmp_path / "out" / "status.json")


def test_a_rank_killed_on_the_second_node_fails_the_point(tmp_path, vcluster):
    thread, outcome, run, lines = _start(tmp_path, vcluster)
    ranks_on_n2 = [p for p in processes_in([vcluster.namespace("n2")])
                   if str(run) in Path(f"/proc/{p}/cwd").resolve().as_posix() and _is_python(p)]
    assert ranks_on_n2, "no rank process found on n2"
    for pid in ranks_on_n2:
        os.kill(pid, signal.SIGKILL)
    verdict, subs, log = _finish(thread, outcome, run, lines)
    assert verdict.outcome == "failed", log
    assert len(subs) == 1, "a lost rank must not be resubmitted"
    # srun ends the other rank with TERM; the reason names the rank that really died, and where
    assert "the launcher lost rank 1 on n2: Killed first" in verdict.reason, verdict.reason
    record = _record(tmp_path, verdict, subs, run)
    assert record["outcome"] == "failed" and record["train"] is None and record["reason"] == verdict.reason


def test_a_whole_node_lost_fails_the_point_with_the_reason(tmp_path, vcluster):
    thread, outcome, run, lines = _start(tmp_path, vcluster)
    try:
        for pid in processes_in([vcluster.namespace("n2")]):   # slurmd, slurmstepd and the rank: the node is gone
            os.kill(pid, signal.SIGKILL)
        verdict, subs, log = _finish(thread, outcome, run, lines)
    finally:
        vcluster.restart_node("n2")
    assert verdict.outcome == "failed", log
    assert len(subs) == 1, "a lost node must not be resubmitted (limits.resubmit_on_node_fail is false)"
    # Slurm ends the job as NODE_FAIL once n2's slurmd stops answering (SlurmdTimeout); the point says so, and
    # how to have such points resubmitted (jobs.outcome.decide)
    assert verdict.reason.startswith("a node of the job failed (scheduler state NODE_FAIL); set the site's "
                                     "limits.resubmit_on_node_fail to resubmit such points"), log
    # n1's rank was stopped by srun after the loss (TERM), not lost: the reason must not blame it
    assert "on n1" not in verdict.reason, verdict.reason
    record = _record(tmp_path, verdict, subs, run)
    assert record["outcome"] == "failed" and record["train"] is None and record["reason"] == verdict.reason
    assert vcluster.node_states() == {"n1": "idle", "n2": "idle"}


def _is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
