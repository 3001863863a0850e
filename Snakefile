# firescale: how fast does deep-network training scale on this cluster?
#   snakemake --profile NAME speedup_sweep    baseline, every sweep point, then the report
# The profile (site/NAME/config.yaml, installed by `make setup`) chooses the site; experiments live in
# workflow/config.yaml. Rules only wire files: each calls one `firescale` command.
import os

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: os.path.join(workflow.basedir, "workflow", "config.yaml")


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"


wildcard_constraints:
    site=SITE,
    experiment="|".join(EXPERIMENTS),
    point=r"baseline|g\d+-b\d+-r\d+",



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
        [RUN_RESULT.format(site=SITE, experiment=e, point="baseline") for e in EXPERIMENTS],


rule predict:
    input:
        [PREDICTION.format(site=SITE, experiment=e) for e in EXPERIMENTS],


rule render:
    input:
        PLAN.files(JOB_SCRIPT),


rule report:
    input:
        report_files(),
