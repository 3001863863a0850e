"""The workflow plans the sweep from a profile installed where Snakemake looks; lint is clean."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from site_helpers import REPO

SNAKEMAKE = shutil.which("snakemake", path=str(Path(os.sys.executable).parent)) or "snakemake"


@pytest.fixture(scope="module")
def config_home(tmp_path_factory):
    """A fresh XDG config home with the site profiles installed by the Makefile's own step."""
    home = tmp_path_factory.mktemp("xdg")
    proc = subprocess.run(["make", "--no-print-directory", "profiles", f"PROFILE_HOME={home / 'snakemake'}"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("titan", "ib-cluster", "local"):
        installed = home / "snakemake" / name / "config.yaml"
        assert installed.read_text() == (REPO / "site" / name / "config.yaml").read_text()
    return home


def _snakemake(config_home, *args):
    """Snakemake on the repository's workflow, planning in a scratch directory so no earlier run counts."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    work = config_home / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work), *args],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)


def _jobs(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_titan_profile_plans_one_job_per_sweep_point(config_home):
    proc = _snakemake(config_home, "--profile", "titan", "speedup_sweep", "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    assert jobs["render_job"] == 11 and jobs["run_point"] == 11, jobs    # NiN's four and GoogLeNet's seven
    for point in ("baseline", "g32-b256-r0", "g32-b1024-r0", "g128-b1024-r0"):
        assert f"results/titan/nin-imagenet/runs/{point}/result.json" in proc.stdout
    assert "firescale site render titan" in proc.stdout


def test_titan_lr_sweep_plans_googlenets_five_rates(config_home):
    proc = _snakemake(config_home, "--profile", "titan", "lr_sweep", "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    assert jobs["run_point"] == 6 and jobs["render_job"] == 6, jobs     # the baseline and five rates
    for lr in ("0.02", "0.04", "0.08", "0.16", "0.32"):
        assert f"results/titan/googlenet-imagenet/runs/g32-b1024-lr{lr}-r0/result.json" in proc.stdout
    assert "g128-b1024" not in proc.stdout and "nin-imagenet/runs" not in proc.stdout


def test_local_profile_plans_fashion_mnist_with_three_repeats_of_each_point(config_home):
    proc = _snakemake(config_home, "--profile", "local", "speedup_sweep", "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    assert jobs["ingest"] == 1 and jobs["run_point"] == 9, jobs     # baseline, g2-b64, g2-b128, 3 each
    for point in ("baseline", "baseline-r2", "g2-b64-r1", "g2-b128-r2"):
        assert f"results/local/fashion-lenet/runs/{point}/result.json" in proc.stdout
    assert "idx:/usr/share/datasets/fashion-mnist" in proc.stdout


def test_the_batch_schedule_example_plans_its_phased_points_on_local(config_home):
    example = REPO / "workflow" / "examples" / "digits-batch-schedule.yaml"
    proc = _snakemake(config_home, "reports/local/digits-batch-schedule/report.md", "-n", "--profile", "local",
                      "--configfile", str(example))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    assert jobs["run_point"] == 5 and jobs["render_job"] == 5, jobs   # baseline, 16, 32, 16+ and 32+
    for point in ("g1-b8+16at200-r0", "g1-b8+32at200-r0"):
        assert f"results/local/digits-batch-schedule/runs/{point}/result.json" in proc.stdout
    assert "fashion-lenet" not in proc.stdout


def _command(output: str, *words: str) -> str:
    """The first command line of a dry run (`-p`) with all of `words`."""
    return next(line for line in output.splitlines() if all(w in line for w in words))


def test_calibrate_false_plans_no_calibration_and_recalibrate_reaches_the_calibration(tmp_path, config_home):
    """An experiment with `calibrate: false` is predicted for its report without a calibration (no calibration job
    to render or run); `--config recalibrate=True` passes --recalibrate to `sweep calibrate` and stays out of the
    experiments files the rules read."""
    override = tmp_path / "uncalibrated.yaml"
    override.write_text(yaml.safe_dump({"experiments": {"fashion-lenet": {"calibrate": False}}}))
    proc = _snakemake(config_home, "--profile", "local", "speedup_sweep", "-n", "-p", "--configfile", str(override))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    assert "calibrate" not in jobs and "render_calibration_job" not in jobs and jobs["predict_calibrated"] == 1, jobs
    predict = _command(proc.stdout, "firescale predict experiment", "predict-calibrated.json")
    assert "--calibration" not in predict
    proc = _snakemake(config_home, "--profile", "local", "speedup_sweep", "-n", "-p", "--config", "recalibrate=True")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    calibrate = _command(proc.stdout, "firescale sweep calibrate local")
    assert calibrate.split(" > ")[0].endswith(" --recalibrate")
    predict = _command(proc.stdout, "firescale predict experiment", "predict-calibrated.json")
    assert "--calibration results/local/fashion-lenet/calibration.json" in predict
    for written in ("experiments.yaml", "fashion-lenet/experiment.yaml"):
        read = yaml.safe_load((config_home / "work" / "results" / "local" / written).read_text())
        assert "recalibrate" not in read and read["experiments"]["fashion-lenet"]["calibrate"] is True, written


def test_the_profile_is_not_read_from_site_folder(tmp_path, config_home):
    empty_home = tmp_path / "nothing"
    empty_home.mkdir()
    proc = _snakemake(empty_home, "--profile", "titan", "speedup_sweep", "-n")
    assert proc.returncode != 0
    assert "titan" in (proc.stdout + proc.stderr)


def test_a_point_over_the_site_limit_is_refused_before_anything_runs(tmp_path, config_home):
    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    config["experiments"]["nin-imagenet"]["sweep"]["points"].append({"gpus": 20000, "batch": 20000})
    override = tmp_path / "config.yaml"
    override.write_text(yaml.safe_dump(config))
    proc = _snakemake(config_home, "--profile", "titan", "speedup_sweep", "-n", "--configfile", str(override))
    assert proc.returncode != 0
    assert "point nin-imagenet/g20000-b20000-r0 needs 20000 nodes" in proc.stdout + proc.stderr
    assert "limits.max_nodes 18688" in proc.stdout + proc.stderr


def test_a_key_given_twice_in_an_experiments_file_stops_the_workflow(tmp_path, config_home):
    override = tmp_path / "config.yaml"
    override.write_text((REPO / "workflow" / "config.yaml").read_text() + "site: titan\n")
    proc = _snakemake(config_home, "--profile", "titan", "speedup_sweep", "-n", "--configfile", str(override))
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert f"{override}: line " in said and "key 'site' is given twice" in said


def _snakemake_from_the_project(work, *args):
    """Snakemake started in the project folder, as the README shows it (`--profile site/NAME`), planning in `work`."""
    return subprocess.run([SNAKEMAKE, "--directory", str(work), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_the_profile_form_site_name_plans_from_the_project_folder(tmp_path):
    proc = _snakemake_from_the_project(tmp_path, "--profile", "site/local", "speedup_sweep", "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using profile site/local" in proc.stderr
    jobs = _jobs(proc.stdout)
    assert jobs["ingest"] == 1 and jobs["run_point"] == 9, jobs


MINE = """\
experiments:
  mine:
    net: lenet_same
    dataset: {name: fashion-mnist, source: "idx:/usr/share/datasets/fashion-mnist"}
    solver: workflow/solvers/lenet-fashion.prototxt
    batch: {baseline: 64}
    walltime: "00:20:00"
    sweep: {gpus: [2]}
    sites: {local: null}
"""


@pytest.mark.parametrize("edit,sentence", [
    (("sweep: {gpus: [2]}", "sweeps: {gpus: [2]}"),
     "unknown key 'sweeps' under 'experiments.mine' (did you mean 'sweep'?); allowed keys: batch, calibrate, "
     "dataset, description, epochs, framework, lr_scaling, max_resubmits, net, precision, process_group, repeats, "
     "sites, solver, stall_after, sweep, target, walltime, warmup_iters"),
    (('walltime: "00:20:00"', "walltime: 10:00"),
     "key 'experiments.mine.walltime' is 600, which YAML read from an unquoted 10:00; quote it, in the form "
     '[D-]HH:MM:SS: walltime: "00:10:00" (600 s, as YAML read it)'),
])
def test_a_mistake_in_an_added_experiments_file_stops_snakemake_with_one_sentence(tmp_path, edit, sentence):
    """Not snakemake.utils.validate's ValidationError and its ~250 lines of schema: firescale's sentence, naming
    the --configfile the mistake is in (not workflow/config.yaml, which Snakemake merged it into)."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(MINE.replace(*edit))
    proc = _snakemake_from_the_project(tmp_path / "work", "--profile", "site/local", "speedup_sweep", "-n",
                                       "--configfile", str(mine))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()]
    assert errors == [f"error: {mine}: {sentence}"], proc.stdout + proc.stderr
    notes = ("Creating specified working directory", "Config file", "Using profile")   # Snakemake's own, and no more
    others = [line for line in (proc.stdout + proc.stderr).splitlines() if line not in errors]
    assert others and all(line.startswith(notes) for line in others), proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_calibration_measures_the_sweeps_most_ranks_and_a_clusters_reads_when_measured(tmp_path, monkeypatch):
    """Every site measures the same things in its calibration job: the short run, and Horovod's allreduce
    probe on the sweep's most ranks; a cluster also takes its reads from a bench-io.json someone measured
    there in a job (on this machine the runs' own reads are in their times)."""
    from firescale.sweep.plan import SweepPlan

    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    local = SweepPlan.build({**config, "site": "local"}, base=REPO)
    probe = ["--allreduce-probe", "2", "--probe-timeout", "300"]    # 30 minutes leave the default for 3 rounds
    # half the baseline's 64 (the 2 x 32 point's), started as often as the baseline (3 repeats here); the
    # short runs and 3 rounds of copies in the other 15 minutes
    short = ["--short-run", "300", "--short-batch", "32", "--short-runs", "3", "--run-timeout", "150"]
    assert local.calibration_options("fashion-lenet") == [*short, *probe]
    titan = SweepPlan.build({**config, "site": "titan"}, base=REPO)
    most = max(p.ranks for p in titan.points["nin-imagenet"])
    assert most > 1
    # one GPU a node: no copies sharing one, the short run alone in an hour gets the default 600 s
    assert titan.calibration_options("nin-imagenet") == ["--short-run", "300", "--short-batch", "8",
                                                         "--short-runs", "1", "--run-timeout", "600",
                                                         "--allreduce-probe", str(most), "--probe-timeout", "300"]
    measured = tmp_path / "results" / "titan" / "bench-io.json"     # a node's reads, `bench io --json` in a job
    measured.parent.mkdir(parents=True)
    measured.write_text("{}")
    assert titan.calibration_options("nin-imagenet")[-2:] == ["--io-record", str(measured)]   # absolute: for a job
    (tmp_path / "results" / "local").mkdir()
    (tmp_path / "results" / "local" / "bench-io.json").write_text("{}")
    assert local.calibration_options("fashion-lenet") == [*short, *probe]
    # an experiment whose runs overlap the allreduce times the probe beside its step too
    config["experiments"]["fashion-lenet"]["sweep"]["overlap_allreduce"] = True
    overlapped = SweepPlan.build({**config, "site": "local"}, base=REPO)
    assert overlapped.calibration_options("fashion-lenet") == [*short, *probe, "--probe-overlap"]
    # a PyTorch experiment's probe is torch.distributed's, timed on its own (its records name the backend)
    config["experiments"]["fashion-lenet"]["framework"] = "pytorch"
    torch_plan = SweepPlan.build({**config, "site": "local"}, base=REPO)
    assert torch_plan.calibration_options("fashion-lenet") == [*short, *probe]


def test_the_calibration_jobs_steps_fit_in_its_walltime(tmp_path, monkeypatch):
    """Every step of the calibration job running out of its time limit must not take the job past its
    walltime: on the virtual cluster of two ranks a node (20 minutes, 2 nodes of 2 ranks: a probe over both
    nodes and one over a node, 3 rounds each) a probe round gets 100 s, not the default 300 (which could take
    30 minutes), and the 3 short runs (as many as the baseline's repeats) and 3 rounds of copies on one node
    and on both (9 steps) share the other half, 66 s each (a step took 24-31 s there); with one rank a node
    there is no probe of one node's ranks and nothing shares a node: a probe round gets 150 s of 15 minutes,
    the one short run 450."""
    from firescale.cluster.ranks import contention_nodes, timeout_within
    from firescale.errors import FirescaleError
    from firescale.sweep.plan import SweepPlan

    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    vcluster = SweepPlan.build({**config, "site": "vcluster-2x2"}, base=REPO)
    assert vcluster.site.default_walltime == "00:20:00"
    assert contention_nodes(vcluster.site, 4) == [1, 2]
    options = vcluster.calibration_options("fashion-lenet")
    assert options[options.index("--allreduce-probe") + 1] == "4"
    assert options[options.index("--probe-timeout") + 1] == "100"
    assert options[options.index("--short-runs") + 1] == "3"
    assert options[options.index("--run-timeout") + 1] == "66"
    # one rank a node and one link: no probe of a node's ranks to budget, 3 rounds in half of 15 minutes
    single = SweepPlan.build({**config, "site": "vcluster"}, base=REPO)
    assert contention_nodes(single.site, 2) == []
    options = single.calibration_options("fashion-lenet")
    assert options[options.index("--allreduce-probe") + 1] == "2"
    assert options[options.index("--probe-timeout") + 1] == "150"
    assert options[options.index("--short-runs") + 1] == "1"
    assert options[options.index("--run-timeout") + 1] == "450"
    assert timeout_within(600, 6, 300) == 60.0         # never under a minute
    assert timeout_within(48 * 3600, 6, 300) == 300.0  # nor over the longest
    with pytest.raises(FirescaleError, match="1 or more steps"):
        timeout_within(900, 0, 300)


def test_the_calibrations_short_run_trains_at_the_smallest_batch_a_points_rank_trains_at(tmp_path, monkeypatch):
    """Half the baseline's batch, unless a point's ranks train at less (a fixed total batch over many ranks,
    or a later phase of a batch schedule): then at that, so that no point's compute is extrapolated below
    the two batches the calibration measured."""
    from firescale.sweep.plan import SweepPlan

    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    local = SweepPlan.build({**config, "site": "local"}, base=REPO)
    assert local.short_run_batch("fashion-lenet") == 32                 # baseline 64; points 2 x 32 and 2 x 64
    vcluster = SweepPlan.build({**config, "site": "vcluster-2x2"}, base=REPO)
    assert vcluster.short_run_batch("fashion-lenet") == 16              # the 4-rank point at 64: 16 a rank
    options = vcluster.calibration_options("fashion-lenet")
    assert options[options.index("--short-batch") + 1] == "16"
    titan = SweepPlan.build({**config, "site": "titan"}, base=REPO)
    assert titan.short_run_batch("nin-imagenet") == 8                   # 256 over 32 ranks, 1024 over 128
    example = yaml.safe_load((REPO / "workflow" / "examples" / "digits-batch-schedule.yaml").read_text())
    scheduled = example["experiments"]["digits-batch-schedule"]
    scheduled["sweep"]["batch_schedules"] = [[{"iteration": 0, "batch": 8}, {"iteration": 200, "batch": 2}]]
    config["experiments"].update(example["experiments"])
    plan = SweepPlan.build({**config, "site": "local"}, experiments=["digits-batch-schedule"], base=REPO)
    assert plan.short_run_batch("digits-batch-schedule") == 2           # baseline 8, a phase at 2


def test_the_calibration_job_fits_from_every_repeat_of_the_baseline(tmp_path, monkeypatch):
    """The report measures the baseline by its repeats' mean, so the calibration fits from all of them, not
    from the first alone (one slow first run put every prediction of a local sweep 17-22% long)."""
    from firescale.sweep.jobs import calibration_job
    from firescale.sweep.plan import SweepPlan

    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    local = SweepPlan.build({**config, "site": "local"}, base=REPO)
    names = [p.name for p in local.baselines("fashion-lenet")]
    assert len(names) > 1
    command = calibration_job(local, "fashion-lenet").command
    records = [Path(command[i + 1]) for i, arg in enumerate(command) if arg == "--record"]
    assert [(r.parent.name, r.name) for r in records] == [(name, "result.json") for name in names]
