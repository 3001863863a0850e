# firescale: how fast does deep-network training scale on this cluster?
#   snakemake --profile NAME speedup_sweep    baseline, every sweep point, then the report
#   snakemake --profile NAME lr_sweep         the baseline and every rate of a learning-rate search
#   snakemake --profile NAME results_table    one table per experiment across the sites that ran it
# The profile (site/NAME/config.yaml: installed by `make setup`, or named as --profile site/NAME from this
# folder) chooses the site; experiments live in workflow/config.yaml. Rules only wire files: each calls one
# `firescale` command.
import os
import sys

from snakemake.utils import min_version

from firescale.errors import FirescaleError
from firescale.sweep.config import check_workflow_config

min_version("9.0")


configfile: os.path.join(workflow.basedir, "workflow", "config.yaml")


# The experiments checked against workflow/schemas/config.schema.yaml, the schema's defaults filled in, as every
# firescale command checks them: a mistake stops the workflow here with one sentence naming the file and key.
try:
    check_workflow_config(config, workflow.configfiles)
except FirescaleError as exc:
    sys.exit(f"error: {exc}")


include: "workflow/rules/common.smk"


wildcard_constraints:
    site=SITE,
    experiment="|".join(EXPERIMENTS),
    point=POINT_WILDCARD,



include: "workflow/rules/data.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/jobs.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/report.smk"


rule speedup_sweep:
    input:
        PLAN.files(RUN_RESULT),
        report_files(),


rule baseline:
    input:
        [baseline_results(e) for e in EXPERIMENTS],


# FireCaffe's learning-rate search: the baseline and every rate of each experiment that searches one.
# The experiment's report (`report`, `speedup_sweep`) has the search's table and the rate it chose.
rule lr_sweep:
    input:
        [baseline_results(e) for e in LR_SEARCH],
        [PLAN.files(RUN_RESULT, e, lr_search=True) for e in LR_SEARCH],


rule predict:
    input:
        [PREDICTION.format(site=SITE, experiment=e) for e in EXPERIMENTS],


rule render:
    input:
        PLAN.files(JOB_SCRIPT),
        [CALIBRATION_JOB.format(site=SITE, experiment=e) for e in EXPERIMENTS if PLAN.calibrates(e)],


rule report:
    input:
        report_files(),
