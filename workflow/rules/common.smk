# The plan of this run: the site the profile chose, its experiments and their sweep points.
# A point larger than the site allows stops the workflow here, before anything is submitted.
from firescale.workflow import Plan

PLAN = Plan.build(config)
SITE = PLAN.site.name
EXPERIMENTS = list(PLAN.points)

JOB_SCRIPT = "results/{site}/{experiment}/jobs/{point}.sh"
RUN_RESULT = "results/{site}/{experiment}/runs/{point}/result.json"
RUN_STATUS = "results/{site}/{experiment}/runs/{point}/status.json"
REPORT_DIR = "reports/{site}/{experiment}"


wildcard_constraints:
    site=SITE,
    experiment="|".join(EXPERIMENTS),
    point=r"baseline|g\d+-b\d+-r\d+",


def dataset_manifest(wildcards):
    """The ingested dataset's manifest, or nothing for a dataset already on the shared filesystem."""
    if PLAN.dataset(wildcards.experiment)["source"] == "existing":
        return []
    return str(PLAN.dataset_dir(wildcards.experiment) / "manifest.json")


def baseline_result(wildcards):
    """Every sweep point waits for its experiment's baseline, whose accuracy is its target."""
    if wildcards.point == "baseline":
        return []
    return RUN_RESULT.format(site=SITE, experiment=wildcards.experiment, point="baseline")


def report_files():
    return [REPORT_DIR.format(site=SITE, experiment=e) + "/report.md" for e in EXPERIMENTS]
