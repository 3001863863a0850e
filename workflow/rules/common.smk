# The plan of this run: the site the profile chose, its experiments and their sweep points.
# A point larger than the site allows stops the workflow here, before anything is submitted.
import os

from firescale.cluster.site import add_site_folder
from firescale.sweep.descriptions import write_config, write_descriptions
from firescale.sweep.plan import SweepPlan
from firescale.sweep.points import POINT_WILDCARD

# Sites are looked up in this project's site/ (then $FIRESCALE_SITE_PATH), here and in every command
# the rules call; relative paths of the experiments (solver, layer_plan) are read from this folder.
add_site_folder(os.path.join(workflow.basedir, "site"))
PLAN = SweepPlan.build(config, files=workflow.configfiles, base=workflow.basedir)
SITE = PLAN.site.name
EXPERIMENTS = list(PLAN.points)
LR_SEARCH = [e for e in EXPERIMENTS if PLAN.lr_search(e)]
# The experiments as this run sees them (profile and --configfile included), for the commands below: each
# experiment's own file for its rules, each point's description for the rules of that point, each rewritten
# only when it changes (firescale/sweep/descriptions.py), so that adding or editing one experiment or point,
# or moving this folder, leaves the others' jobs finished.  All experiments in one file for the tables.
write_descriptions(PLAN, f"results/{SITE}")
ALL_EXPERIMENTS_CONFIG = write_config(PLAN, f"results/{SITE}/experiments.yaml")
ENV = "../../environment.yml"

EXPERIMENT_CONFIG = "results/{site}/{experiment}/experiment.yaml"
POINT_DESCRIPTION = "results/{site}/{experiment}/points/{point}.yaml"
JOB_SCRIPT = "results/{site}/{experiment}/jobs/{point}.sh"
POINT_FILE = "results/{site}/{experiment}/jobs/{point}.json"
RUN_RESULT = "results/{site}/{experiment}/runs/{point}/result.json"
RUN_STATUS = "results/{site}/{experiment}/runs/{point}/status.json"
REPORT = "reports/{site}/{experiment}/report.md"
PREDICTION = "results/{site}/{experiment}/predict.json"
CALIBRATION = "results/{site}/{experiment}/calibration.json"
CALIBRATION_JOB = "results/{site}/{experiment}/jobs/calibration.sh"
DATASET_MANIFEST = PLAN.dataset_manifest_pattern()


def dataset_manifest(wildcards):
    """The ingested dataset's manifest, or nothing for a dataset already on the shared filesystem."""
    if PLAN.dataset(wildcards.experiment)["source"] == "existing":
        return []
    return DATASET_MANIFEST.format(dataset=PLAN.dataset(wildcards.experiment)["name"])


def baseline_results(experiment):
    """The run records of the baseline's repeats ('baseline', 'baseline-r1', ...)."""
    return [RUN_RESULT.format(site=SITE, experiment=experiment, point=p.name) for p in PLAN.baselines(experiment)]


def calibration_of(wildcards):
    """The experiment's calibration, or nothing for one that sets `calibrate: false` (predicted uncalibrated)."""
    if not PLAN.calibrates(wildcards.experiment):
        return []
    return CALIBRATION.format(site=wildcards.site, experiment=wildcards.experiment)


def report_files():
    return [REPORT.format(site=SITE, experiment=e) for e in EXPERIMENTS]


def parent(path, levels=1):
    for _ in range(levels):
        path = os.path.dirname(path)
    return path
