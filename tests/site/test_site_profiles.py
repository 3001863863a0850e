"""Site profiles: the shipped ones load; broken ones fail with one sentence naming file and key."""
from __future__ import annotations

import subprocess
import sys

import pytest
from site_helpers import REPO, site_copy, site_folder_copy

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


def _message(path):
    """The one sentence load_site refuses the site at `path` with."""
    with pytest.raises(FirescaleError) as info:
        load_site(path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("edit,sentence", [
    # YAML 1.1 reads an unquoted H:M:S as a number in base 60: 48:00:00 is 172800
    (('max_walltime: "48:00:00"', "max_walltime: 48:00:00"),
     "key 'limits.max_walltime' is 172800, which YAML read from an unquoted 48:00:00; "
     'quote it: max_walltime: "48:00:00"'),
    # ... and 10:00 is 600 (seconds), which quoted is still no [D-]HH:MM:SS: the form of those 600 s is given
    (('default_walltime: "04:00:00"', "default_walltime: 10:00"),
     "key 'limits.default_walltime' is 600, which YAML read from an unquoted 10:00; "
     'quote it, in the form [D-]HH:MM:SS: default_walltime: "00:10:00" (600 s, as YAML read it)'),
    (("account: null", "account: 12345"),
     "key 'account' is the number 12345, where text is expected; quote it: account: \"12345\""),
    (("qos: null", "qos: yes"), "key 'qos' is true, which YAML read from an unquoted yes; quote it: qos: \"yes\""),
])
def test_a_value_yaml_turned_into_a_number_says_quote_it(tmp_path, edit, sentence):
    folder = site_folder_copy(tmp_path, "ib-cluster", edit)
    assert _message(folder) == f"{folder / 'site.yaml'}: {sentence}"


def test_a_misspelt_key_or_value_is_told_the_one_meant(tmp_path):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("partition: gpu", "partiton: gpu"), folder="a/ib-cluster")
    message = _message(folder)
    assert message.startswith(f"{folder / 'site.yaml'}: unknown key 'partiton' at the top level "
                              "(did you mean 'partition'?); allowed keys: account, allreduce, "), message
    assert message.endswith(", walltime_signal"), message
    folder = site_folder_copy(tmp_path, "ib-cluster", ("scheduler: slurm", "scheduler: slrum"), folder="b/ib-cluster")
    assert _message(folder) == (f"{folder / 'site.yaml'}: key 'scheduler': 'slrum' is not allowed (did you mean "
                                "'slurm'?); known values: local, pbs, slurm, torque")


@pytest.mark.parametrize("container,sentence", [
    ("{image: /x.sif, runtime: docker}",
     "key 'environment.container.runtime': 'docker' is not allowed; known values: apptainer, shifter, singularity"),
    ("{image: /x.sif, runtime: apptainr}",
     "key 'environment.container.runtime': 'apptainr' is not allowed (did you mean 'apptainer'?); "
     "known values: apptainer, shifter, singularity"),
    ("docker://pytorch",
     "key 'environment.container': 'docker://pytorch' is not allowed; expected null or a mapping with the keys "
     "image (required), options, runtime"),
    ("{img: /x.sif}", "unknown key 'img' under 'environment.container' (did you mean 'image'?); "
                      "allowed keys: image, options, runtime"),
    ("{runtime: apptainer}", "missing required key 'image' in 'environment.container'"),
])
def test_a_container_mistake_says_what_is_allowed(tmp_path, container, sentence):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("  venv: /shared", f"  container: {container}\n  venv: /shared"))
    assert _message(folder) == f"{folder / 'site.yaml'}: {sentence}"


def _lint_folder(folder):
    proc = _lint(str(folder))
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc, proc.stdout.splitlines()


def _only_line(lines, start):
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, lines
    return found[0]


def test_lint_refuses_a_slurm_site_without_a_partition_and_says_where_jobs_go(tmp_path):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("partition: gpu ", "# partition: gpu "))
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 1
    error = _only_line(lines, f"error: {folder / 'site.yaml'}: key 'partition': ")
    assert "a Slurm site names the partition its jobs go to" in error and "`sinfo -s`" in error, error
    assert "site lint: 1 problem(s)" in lines
    assert "site ib-cluster: jobs go to Slurm partition 'gpu'" in _lint_folder(REPO / "site" / "ib-cluster")[1]
    assert ("site local: no partition or queue: the site has no scheduler, its jobs run on this machine"
            in _lint_folder(REPO / "site" / "local")[1])
    assert "site titan: jobs go to Torque queue 'batch'" in _lint_folder(REPO / "site" / "titan")[1]


def test_lint_refuses_an_srun_mpi_plugin_slurm_does_not_ship(tmp_path):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("srun_mpi: pmix ", "srun_mpi: pmixx "))
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 1
    assert _only_line(lines, "error: ") == (
        f"error: {folder / 'site.yaml'}: key 'srun_mpi': 'pmixx' is not an MPI plugin of Slurm (did you mean "
        "'pmix'?); known: none, pmi2, pmix, pmix_v3, pmix_v4, pmix_v5, cray_shasta (`srun --mpi=list` on a "
        "compute node shows the cluster's)")


def test_lint_warns_of_cores_that_do_not_divide_among_the_gpus_and_refuses_fewer_than_gpus(tmp_path):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("gpus: 4 ", "gpus: 8 "), ("cores: 40 ", "cores: 100 "),
                              folder="uneven/ib-cluster")
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 0, proc.stdout
    assert _only_line(lines, "warning: ") == (
        f"warning: {folder / 'site.yaml'}: key 'node.cores': 100 cores do not divide among 8 GPUs; each rank "
        "gets 12 and 4 stay idle; give the cores Slurm or PBS counts on a node (`sinfo -o %c`, `pbsnodes`)")
    assert lines[-1] == "site lint: OK (1 warning(s))"
    folder = site_folder_copy(tmp_path, "ib-cluster", ("gpus: 4 ", "gpus: 8 "), ("cores: 40 ", "cores: 4 "),
                              folder="few/ib-cluster")
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 1
    assert _only_line(lines, "error: ") == (f"error: {folder / 'site.yaml'}: key 'node.cores': fewer cores than "
                                            "GPUs per node; each rank needs at least one core")


def test_lint_of_a_copied_site_no_experiment_lists_says_what_to_add_and_plans_no_point(tmp_path):
    folder = site_folder_copy(tmp_path, "ib-cluster", ("name: ib-cluster", "name: my-cluster"), folder="my-cluster")
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 1          # the copied profile still chooses ib-cluster
    assert _only_line(lines, "error: ") == (
        f"error: {folder / 'config.yaml'}: key 'config': site=ib-cluster chooses another site, so `snakemake "
        f"--profile {folder}` would run on ib-cluster; set it to `config: [site=my-cluster]`")
    profile = folder / "config.yaml"
    profile.write_text(profile.read_text().replace("site=ib-cluster", "site=my-cluster"))
    proc, lines = _lint_folder(folder)
    assert proc.returncode == 0, proc.stdout
    assert _only_line(lines, "warning: ") == (
        "warning: workflow/config.yaml: no experiment lists site 'my-cluster' under its 'sites', so the workflow "
        "would stop before planning any point; add `my-cluster: null` (or its own sweep, e.g. `my-cluster: "
        "{gpus: [1, 4]}`) under 'sites' of each experiment it should run (fashion-lenet, googlenet-imagenet, "
        "nin-imagenet)")
    assert ("site my-cluster: 2 job script(s) rendered and checked with bash -n (the site alone, no sweep point)"
            in lines)
    assert lines[-1] == "site lint: OK (1 warning(s))"
