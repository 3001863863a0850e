"""The virtual cluster's files and the localhost Slurm's slurm.conf, as golden files; no root needed.

The golden files were written by the code before it moved into firescale.testing (layout, host_files,
slurm_conf and the shell templates): what the cluster writes has not changed.
"""
from __future__ import annotations

import difflib
import os
import stat
import subprocess
from pathlib import Path

import jinja2
import pytest

from firescale.testing.host_files import CLIENTS, render_script, write_host_files
from firescale.testing.slurm_conf import SlurmNode, slurm_conf
from firescale.testing.vcluster import VirtualCluster

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FIRESCALE_UPDATE_GOLDEN") == "1"
FILES = ["slurm.conf", "hosts", "enter", "bin/sinfo", "ssh-bin/ssh"]


def _matches_golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if UPDATE or not golden.exists():
        if not UPDATE:
            pytest.fail(f"no golden file {golden.name}; create it on purpose with "
                        f"FIRESCALE_UPDATE_GOLDEN=1 pytest {__file__}")
        golden.write_text(text)
    expected = golden.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(golden), "written"))
        pytest.fail(f"{name} changed:\n{diff}\nIf the change is intended, update the golden files on purpose: "
                    f"FIRESCALE_UPDATE_GOLDEN=1 pytest {__file__}, and review the diff before committing.")


@pytest.fixture
def written(tmp_path, monkeypatch) -> VirtualCluster:
    """The files of a 3-node cluster on a 2-core machine without Slurm on PATH (the shims name each client bare)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=3)
    write_host_files(cluster)
    return cluster


@pytest.mark.parametrize("name", FILES)
def test_the_cluster_files_are_as_before(written, name):
    _matches_golden(name.replace("/", "-"), (written.root / name).read_text().replace(str(written.root), "ROOT"))


def test_every_script_is_executable_bash(written):
    scripts = [written.enter, written.ssh_bin / "ssh", *(written.bin / c for c in CLIENTS)]
    assert sorted(p.name for p in written.bin.iterdir()) == sorted(CLIENTS)
    for script in scripts:
        assert stat.S_IMODE(script.stat().st_mode) == 0o755, script
        check = subprocess.run(["/bin/bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script}: {check.stderr}"


def test_the_localhost_slurm_conf_is_as_before():
    text = slurm_conf(cluster="firescale-test", controller="node0", controller_address="127.0.0.1",
                      nodes=[SlurmNode("node0", "127.0.0.1", 2, 4000)], folder=Path("/srv/slurm"),
                      ctld_port=7001, slurmd_port=7002)
    _matches_golden("localhost-slurm.conf", text)


def test_a_value_missing_from_a_script_template_is_an_error():
    with pytest.raises(jinja2.UndefinedError, match="enter"):
        render_script("ssh.sh.j2", name="fsvc")


def test_cpus_per_node_reach_slurm_conf_and_are_read_back(tmp_path, capsys):
    # Two CPUs a node (two ranks taking turns on its core): every node line says so, the status reads it back,
    # and the count is checked before anything is written.
    from firescale.cli import main
    from firescale.testing.layout import VClusterError
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=2, cpus_per_node=2)
    assert cluster.node_cpus() == {}
    write_host_files(cluster)
    nodes = [line for line in cluster.conf.read_text().splitlines() if line.startswith("NodeName=")]
    assert len(nodes) == 2 and all(" CPUs=2 " in line for line in nodes)
    assert cluster.node_cpus() == {"n1": 2, "n2": 2}
    assert cluster.runs_this_conf()
    assert not VirtualCluster(root=tmp_path / "vc", nodes=2).runs_this_conf()   # `up` restarts it at 1 CPU
    for bad in (0, 65):
        with pytest.raises(VClusterError, match=f"{bad} CPUs a node asked for; choose 1 to 64"):
            VirtualCluster(root=tmp_path, cpus_per_node=bad)
    assert main(["vcluster", "status", "--dir", str(tmp_path / "vc"), "--cpus-per-node", "2"]) != 0
    assert "--cpus-per-node goes with `vcluster up` only" in capsys.readouterr().err
