"""Site profiles: the shipped ones load; broken ones fail with one sentence naming file and key."""
from __future__ import annotations

import subprocess
import sys

import pytest
from site_helpers import REPO, site_copy

from firescale.cluster.collectives import SITE_ALGORITHMS
from firescale.cluster.site import load_site, parse_walltime
from firescale.errors import FirescaleError


@pytest.mark.parametrize("name", ["titan", "ib-cluster", "local", "vcluster"])
def test_shipped_sites_load_with_defaults(name):
    site = load_site(name)
    assert site.name == name
    assert site.config["allreduce"]["algorithm"] in SITE_ALGORITHMS
    assert site.config["walltime_signal"]["seconds_before"] >= 10
    assert site.link_bandwidth > 0 and site.device_peak_flops > 0


def test_titan_is_the_firecaffe_machine():
    titan = load_site("titan")
    assert titan.archival and titan.scheduler == "torque" and titan.launcher == "aprun"
    assert titan.gpus_per_node == 1 and titan.config["node"]["cores"] == 16
    assert titan.config["device"]["name"] == "NVIDIA Tesla K20X"
    assert titan.device_peak_flops == pytest.approx(3.935e12)
    assert titan.device_memory_bandwidth == pytest.approx(250e9)
    assert titan.config["interconnect"]["topology"] == "torus-3d"


def test_ib_cluster_marks_what_an_admin_must_edit():
    text = (REPO / "site" / "ib-cluster" / "site.yaml").read_text()
    assert text.count("ADMIN") >= 8
    site = load_site("ib-cluster")
    assert site.scheduler == "slurm" and site.launcher == "srun" and site.gpus_per_node == 4


def _fails(tmp_path, edit, *expected, name="titan"):
    path = site_copy(tmp_path, name, edit)
    with pytest.raises(FirescaleError) as info:
        load_site(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message, message
    return message


def test_missing_key_is_named(tmp_path):
    _fails(tmp_path, lambda d: d["node"].pop("gpus"), "missing required key 'gpus'", "'node'")


def test_wrong_type_is_named(tmp_path):
    _fails(tmp_path, lambda d: d["node"].update(gpus="four"), "key 'node.gpus'", "'four'")


def test_unknown_scheduler_lists_the_known_ones(tmp_path):
    _fails(tmp_path, lambda d: d.update(scheduler="lsf"), "key 'scheduler'", "'lsf'", "local, pbs, slurm, torque")


def test_unknown_launcher_lists_the_known_ones(tmp_path):
    _fails(tmp_path, lambda d: d.update(launcher="jsrun"), "key 'launcher'", "aprun, horovodrun, mpirun, srun")


def test_negative_nodes_are_refused(tmp_path):
    _fails(tmp_path, lambda d: d["limits"].update(max_nodes=-4), "key 'limits.max_nodes'", "minimum of 1")


def test_unknown_key_is_named_with_the_allowed_ones(tmp_path):
    _fails(tmp_path, lambda d: d["interconnect"].update(bandwith_gbits=70),
           "unknown key 'bandwith_gbits' under 'interconnect'", "bandwidth_gbits")


def test_bad_walltime_is_named(tmp_path):
    _fails(tmp_path, lambda d: d["limits"].update(max_walltime="24h"), "key 'limits.max_walltime'", "[D-]HH:MM:SS")


def test_name_must_match_folder(tmp_path):
    _fails(tmp_path, lambda d: d.update(name="jaguar"), "must equal the site's folder name 'titan'")


def test_slurm_site_with_a_pbs_queue_is_refused(tmp_path):
    _fails(tmp_path, lambda d: d.update(queue="batch"), "Slurm sites name a 'partition'", name="ib-cluster")


def test_mpirun_on_a_site_without_a_scheduler_cannot_span_nodes(tmp_path):
    _fails(tmp_path, lambda d: d["limits"].update(max_nodes=4), "a site without a scheduler runs on one node",
           name="local")


def test_mpirun_x_option_is_refused_because_firescale_forwards_the_environment(tmp_path):
    _fails(tmp_path, lambda d: d.update(launcher="mpirun", launcher_options=["-x", "FOO"]),
           "key 'launcher_options'", "mca_base_env_list", "environment.variables", name="vcluster")


def test_srun_mpi_plugin_must_be_a_plugin_name(tmp_path):
    _fails(tmp_path, lambda d: d.update(srun_mpi="pmix; rm -rf ~"), "key 'srun_mpi'", name="vcluster")


def test_injection_in_account_is_refused_by_the_schema(tmp_path):
    _fails(tmp_path, lambda d: d.update(account="x; rm -rf ~"), "key 'account'")


def test_unknown_site_name_lists_known_sites():
    with pytest.raises(FirescaleError, match="known sites: .*ib-cluster.*local.*titan"):
        load_site("jaguar")


def test_invalid_yaml_names_the_line(tmp_path):
    bad = tmp_path / "titan" / "site.yaml"
    bad.parent.mkdir()
    bad.write_text("name: titan\nnode: [1, 2\n")
    with pytest.raises(FirescaleError, match=r"site.yaml: line \d+ is not valid YAML"):
        load_site(bad)


@pytest.mark.parametrize("text,seconds",
                         [("00:00:30", 30), ("02:00:00", 7200), ("1-00:00:00", 86400), ("48:00:00", 172800)])
def test_walltime_parsing(text, seconds):
    assert parse_walltime(text) == seconds


def _lint(*args):
    return subprocess.run([sys.executable, "-m", "firescale", "site", "lint", *args],
                          capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("name", ["titan", "ib-cluster", "local", "vcluster"])
def test_lint_passes_for_shipped_sites(name):
    proc = _lint(name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "site lint: OK" in proc.stdout


def test_lint_of_a_copy_with_one_bad_key_names_that_key(tmp_path):
    path = site_copy(tmp_path, "titan", lambda d: d["device"].update(peak_tflops="fast"))
    proc = _lint(str(path.parent))
    assert proc.returncode == 1
    assert "key 'device.peak_tflops'" in proc.stdout and str(path) in proc.stdout


def test_lint_reports_every_problem(tmp_path):
    def edit(d):
        d["node"]["gpus"] = 0
        d["scheduler"] = "lsf"
    proc = _lint(str(site_copy(tmp_path, "titan", edit).parent))
    assert proc.returncode == 1
    assert "key 'node.gpus'" in proc.stdout and "key 'scheduler'" in proc.stdout
    assert "2 problem(s)" in proc.stdout


def test_lint_refuses_a_sweep_over_the_site_limits(tmp_path):
    path = site_copy(tmp_path, "titan", lambda d: d["limits"].update(max_nodes=64, max_walltime="12:00:00"))
    proc = _lint(str(path.parent))
    assert proc.returncode == 1
    assert "point nin-imagenet/g128-b1024-r0 needs 128 nodes" in proc.stdout
    assert "limits.max_nodes 64" in proc.stdout
    assert "walltime 24:00:00 exceeds site titan's limits.max_walltime 12:00:00" in proc.stdout
