"""A real single-node Slurm for the tests of this folder, started from a temporary slurm.conf."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from firescale.testing.slurm_conf import SlurmNode, slurm_conf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Start slurmctld and slurmd as root with auth/none; yield the environment that points at them."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "squeue") if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        pytest.fail(f"the Slurm tier needs root and {', '.join(missing) or 'Slurm'}: run `make setup` as root "
                    "(it installs slurmctld slurmd slurm-client), or deselect with -m 'not slurm'")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(cluster="firescale-test", controller=host, controller_address="127.0.0.1",
                               nodes=[SlurmNode(host, "127.0.0.1", os.cpu_count() or 2, 4000)], folder=root,
                               ctld_port=_free_port(), slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["slurmctld", "-i"], env=env, check=True)
    subprocess.run(["slurmd"], env=env, check=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if "idle" in out:
                break
            time.sleep(1)
        else:
            pytest.fail(f"Slurm did not come up: {(root / 'log' / 'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            try:
                os.kill(int((root / pidfile).read_text()), 15)
            except (OSError, ValueError):
                pass
