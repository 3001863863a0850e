"""Profiles and experiments checked whole: no newline reaches a script, no key given twice, no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from site_helpers import REPO, site_copy

from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.jobs.spec import JobSpec
from firescale.sweep.config import load_config
from firescale.sweep.points import limit_errors, plan_sweep, sweep_walltime

EXPERIMENTS = REPO / "workflow" / "config.yaml"


def _refused(tmp_path, edit, *expected, name="ib-cluster"):
    path = site_copy(tmp_path, name, edit)
    with pytest.raises(FirescaleError) as info:
        load_site(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message.split(" (and ")[0], message
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize("edit,key", [
    (lambda d: d.update(account="proj\n"), "key 'account'"),
    (lambda d: d.update(partition="gpu\n"), "key 'partition'"),
    (lambda d: d["environment"].update(variables={"FOO\n": "1"}), "key 'environment.variables'"),
    (lambda d: d["environment"].update(variables={"FOO": "a\nb"}), "key 'environment.variables.FOO'"),
    (lambda d: d.update(directives=["--exclusive\n"]), "key 'directives.0'"),
    (lambda d: d["environment"].update(modules=["cuda\n"]), "key 'environment.modules.0'"),
    (lambda d: d["limits"].update(max_walltime="48:00:00\n"), "key 'limits.max_walltime'"),
    (lambda d: d.update(name="ib-cluster\n"), "key 'name'"),
])
def test_a_trailing_newline_is_refused_everywhere(tmp_path, edit, key):
    _refused(tmp_path, edit, key, "is not allowed")


def test_a_job_environment_name_with_a_newline_is_refused():
    with pytest.raises(FirescaleError, match="is not a shell name"):
        JobSpec(name="j", ranks=1, walltime_s=60, command=["true"], workdir=REPO, log_file=REPO / "l",
                status_file=REPO / "s", env={"FOO\n": "1"})
    with pytest.raises(FirescaleError, match="letters, digits and"):
        JobSpec(name="j\n", ranks=1, walltime_s=60, command=["true"], workdir=REPO, log_file=REPO / "l",
                status_file=REPO / "s")


def test_a_key_given_twice_in_a_site_is_refused_with_its_line(tmp_path):
    path = site_copy(tmp_path, "ib-cluster")
    path.write_text(path.read_text() + "account: other\naccount: proj\n")
    with pytest.raises(FirescaleError, match=r"site.yaml: line \d+: key 'account' is given twice"):
        load_site(path)


def test_a_walltime_not_longer_than_the_signal_lead_is_refused(tmp_path):
    _refused(tmp_path, lambda d: d["limits"].update(default_walltime="00:03:00"),
             "key 'limits.default_walltime': 00:03:00 is not longer than walltime_signal.seconds_before (300 s)")
    site = load_site("ib-cluster")
    config = load_config(EXPERIMENTS, {"site": "ib-cluster"})
    errors = limit_errors(plan_sweep(config, "nin-imagenet", "ib-cluster", 0.01, base=REPO), site, "00:05:00")
    assert any("walltime 00:05:00 is not longer than site ib-cluster's walltime_signal.seconds_before (300 s)" in e
               for e in errors)
    assert not limit_errors(plan_sweep(config, "nin-imagenet", "ib-cluster", 0.01, base=REPO), site, "00:05:01")


def test_requeue_directives_are_refused_on_slurm(tmp_path):
    _refused(tmp_path, lambda d: d.update(directives=["--requeue"]), "key 'directives': '--requeue' is not allowed")


def test_default_walltime_is_the_walltime_of_an_experiment_without_one(tmp_path):
    data = yaml.safe_load(EXPERIMENTS.read_text())
    data["experiments"]["fashion-lenet"].pop("walltime")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path, {"site": "local"})
    assert sweep_walltime(config, "fashion-lenet", load_site("local")) == "00:30:00"  # local's default_walltime
    assert sweep_walltime(load_config(EXPERIMENTS), "fashion-lenet", load_site("local")) == "00:20:00"


def _lint_with(tmp_path, text):
    path = tmp_path / "experiments.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "firescale", "site", "lint", "local", "--config", str(path)],
                          capture_output=True, text=True, cwd=REPO), path


@pytest.mark.parametrize("text,expected", [
    ("", "an experiments file must be a mapping with the keys 'site' and 'experiments', not an empty file"),
    ("- a\n- b\n", "not list"),
    ("site: local\nexperiments: 5\n", "key 'experiments': 5 is not allowed; expected a mapping of keys"),
    ("site: local\nexperiments: {}\nsite: local\n", "line 3: key 'site' is given twice"),
    ("site: local\nexperiments: [\n", "is not valid YAML"),
])
def test_a_malformed_experiments_file_gets_one_sentence_naming_it(tmp_path, text, expected):
    proc, path = _lint_with(tmp_path, text)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(path) in proc.stderr and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


SHIPPED = EXPERIMENTS.read_text()


@pytest.mark.parametrize("edit,sentence", [
    (("    sweep:\n      gpus: [2]", "    sweeps:\n      gpus: [2]"),
     "unknown key 'sweeps' under 'experiments.fashion-lenet' (did you mean 'sweep'?); allowed keys: batch, "
     "calibrate, dataset, description, epochs, framework, lr_scaling, max_resubmits, net, precision, "
     "process_group, repeats, sites, solver, stall_after, sweep, target, walltime, warmup_iters"),
    # YAML 1.1 reads an unquoted 10:00 as 600 (base 60); quoted, 10:00 is still no [D-]HH:MM:SS
    (('walltime: "00:20:00"', "walltime: 10:00"),
     "key 'experiments.fashion-lenet.walltime' is 600, which YAML read from an unquoted 10:00; quote it, in the "
     'form [D-]HH:MM:SS: walltime: "00:10:00" (600 s, as YAML read it)'),
    (("net: lenet_same", "net: lenet_sam"),
     "key 'experiments.fashion-lenet.net': 'lenet_sam' is not allowed (did you mean 'lenet_same'?); expected a "
     "built-in net (lenet_same, nin, alexnet, googlenet, vgg19, vgg16, lenet, caffenet, resnet50, cifar10_quick, "
     "cifar10_full) or a Caffe net file (a path with a '/' or ending in .prototxt), relative to the project folder "
     "or absolute"),
    (("lr_scaling: linear", "lr_scaling: linaer"),
     "key 'experiments.fashion-lenet.lr_scaling': 'linaer' is not allowed (did you mean 'linear'?); known values: "
     "linear, none, sqrt"),
    (("      local: null", "      local: 5"),
     "key 'experiments.fashion-lenet.sites.local': 5 is not allowed; expected a mapping with the keys batch, "
     "batch_schedules, epochs, gpus, lr, overlap_allreduce, points, read_limit_mbs, repeats, walltime or null"),
])
def test_an_experiments_file_mistake_is_one_sentence_with_what_was_meant(tmp_path, edit, sentence):
    """The shipped experiments file with one mistake a user makes, as written (comments, quoting and all)."""
    assert SHIPPED.count(edit[0]) >= 1
    proc, path = _lint_with(tmp_path, SHIPPED.replace(*edit, 1))
    assert proc.returncode == 1 and proc.stderr == f"firescale: error: {path}: {sentence}\n", proc.stderr


def test_an_experiment_value_with_a_newline_is_refused(tmp_path):
    data = yaml.safe_load(EXPERIMENTS.read_text())
    data["experiments"]["fashion-lenet"]["dataset"]["name"] = "fashion-mnist\n"
    proc, path = _lint_with(tmp_path, yaml.safe_dump(data))
    assert proc.returncode == 1 and "key 'experiments.fashion-lenet.dataset.name'" in proc.stderr, proc.stderr


def test_a_solver_key_given_twice_is_refused(tmp_path):
    from firescale.caffe.solver import load_solver

    path = tmp_path / "solver.yaml"
    path.write_text("base_lr: 0.01\nmax_iter: 10\nbase_lr: 0.1\n")
    with pytest.raises(FirescaleError, match="line 3: key 'base_lr' is given twice"):
        load_solver(path)


@pytest.mark.parametrize("text", [
    "", "- a\n", "name: ib-cluster\nlimits: 5\n", "{}\n", "name: [1\n",
])
def test_a_malformed_site_file_gets_sentences_not_a_traceback(tmp_path, text):
    path = tmp_path / "ib-cluster" / "site.yaml"
    path.parent.mkdir()
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "firescale", "site", "lint", str(path.parent)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert str(path) in proc.stdout + proc.stderr


@pytest.mark.parametrize("edit", [
    lambda d: d.update(limits=5), lambda d: d.update(node=None), lambda d: d["environment"].update(variables=5),
    lambda d: d.update(walltime_signal={"seconds_before": "x"}), lambda d: d.update(directives="--exclusive"),
    lambda d: d.update(pbs=[]), lambda d: d["limits"].update(max_walltime=5),
])
def test_a_wrongly_typed_site_key_is_named_not_a_traceback(tmp_path, edit):
    path = site_copy(tmp_path, "ib-cluster", edit)
    proc = subprocess.run([sys.executable, "-m", "firescale", "site", "lint", str(path.parent)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert f"error: {path}: key '" in proc.stdout or f"error: {path}: missing" in proc.stdout, proc.stdout
