"""Results on a shared filesystem: group-readable as the umask allows, one folder per site, one sweep per point."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firescale.atomic import atomic_path, atomic_write_json, atomic_write_text
from firescale.errors import FirescaleError
from firescale.jobs.lock import LOCK_FILE, run_lock, take_lock
from firescale.sweep.jobs import point_record, run_dir
from firescale.sweep.plan import load_plan
from firescale.sweep.points import SweepPoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask,file_mode,dir_mode",
                         [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o077, 0o600, 0o700)])
def test_atomic_files_and_folders_get_the_mode_the_umask_allows(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    atomic_write_json(tmp_path / "result.json", {"a": 1})
    atomic_write_text(tmp_path / "job.sh", "#!/bin/bash\n")
    with atomic_path(tmp_path / "dataset", directory=True) as tmp:
        (tmp / "data.mdb").write_bytes(b"x")
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "job.sh").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "dataset").stat().st_mode) == dir_mode


def test_rendered_job_scripts_and_point_files_are_group_readable(tmp_path, umask):
    umask(0o027)
    out = tmp_path / "baseline.sh"
    proc = subprocess.run([sys.executable, "-m", "firescale", "site", "render", "local", "--experiment",
                           "fashion-lenet", "--point", "baseline", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o750  # executable, group may read and run it
    assert stat.S_IMODE(out.with_suffix(".json").stat().st_mode) == 0o640


def test_run_folders_include_the_site_and_resubmissions_are_bounded_by_both_limits():
    plan = load_plan("ib-cluster", experiments=["nin-imagenet"])  # limits.max_resubmits 5; nin-imagenet asks for 10
    point = SweepPoint("nin-imagenet", 4, 256, 0.01, 0)
    assert run_dir(plan, "nin-imagenet", point) == Path("/shared/firescale/results/ib-cluster/nin-imagenet/g4-b256-r0")
    assert point_record(plan, "nin-imagenet", point).max_resubmits == 5
    # local: limits.max_resubmits 2; fashion-lenet keeps the default 3
    local = load_plan("local", experiments=["fashion-lenet"])
    baseline = SweepPoint("fashion-lenet", 1, 64, 0.01, 0, True)
    assert point_record(local, "fashion-lenet", baseline).max_resubmits == 2


def test_a_lock_names_its_holder_and_keeps_a_second_taker_out(tmp_path):
    with run_lock(tmp_path, "firescale sweep run local e/p1") as held:
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert holder["command"] == "firescale sweep run local e/p1" and holder["user"]
        refusal = r"this point is being run by .* \(pid \d+, since .*: firescale sweep run"
        with pytest.raises(FirescaleError, match=refusal):
            take_lock(tmp_path, "another sweep")
        assert held.holder.pid == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()  # cleared when its holder is done


def test_a_lock_whose_process_is_gone_is_cleared(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = {"host": socket.gethostname(), "pid": gone.pid, "process_start": "1", "boot_id": "", "user": "x",
             "since": "2026-01-01T00:00:00Z", "command": "an old sweep"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    held = take_lock(tmp_path, "new sweep")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "new sweep"
    held.release()


def test_a_lock_of_a_live_process_whose_pid_was_reused_is_cleared(tmp_path):
    reused = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": "0", "boot_id": "", "user": "x",
              "since": "2026-01-01T00:00:00Z", "command": "a sweep long gone"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(reused))
    take_lock(tmp_path, "new sweep").release()


def test_a_lock_from_another_host_is_stale_only_when_not_refreshed(tmp_path):
    other = {"host": "login2.example", "pid": 1, "process_start": "", "boot_id": "", "user": "y",
             "since": "2026-01-01T00:00:00Z", "command": "sweep on login2"}
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps(other))
    with pytest.raises(FirescaleError, match="login2.example"):
        take_lock(tmp_path, "here", stale_after=600)
    old = time.time() - 601
    os.utime(lock, (old, old))
    take_lock(tmp_path, "here", stale_after=600).release()


def test_two_sweep_runs_of_one_point_cannot_both_run(tmp_path):
    run = tmp_path / "results" / "local" / "e" / "baseline"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")
    point = {"site": "local", "experiment": "e", "point": "baseline", "gpus": 1, "nodes": 1, "batch": 64, "lr": 0.1,
             "repeat": 0, "baseline": True, "walltime": "00:10:00", "run_dir": str(run), "max_resubmits": 0,
             "format": "firescale.sweep.point/1"}
    (tmp_path / "point.json").write_text(json.dumps(point))
    argv = [sys.executable, "-m", "firescale", "sweep", "run", "local", "--script", str(script), "--point-file",
            str(tmp_path / "point.json"), "--poll-seconds", "0.5", "--collect", str(tmp_path / "r.json"),
            str(tmp_path / "s.json")]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.time() + 60
        while not (run / LOCK_FILE).exists() and time.time() < deadline:
            time.sleep(0.2)
        second = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert second.returncode == 1 and "this point is being run by" in second.stderr, second.stderr
        assert f"(pid {first.pid}," in second.stderr and "firescale sweep run local e/baseline" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=90)
    assert not (run / LOCK_FILE).exists()  # the first run cancelled its job and released the lock
