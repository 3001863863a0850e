# Predict every point before anything is submitted (Paleo's model with the site's devices and
# interconnect), calibrate on the baseline once it has run, and predict again for the report: each
# point's whole fixed-epoch budget, the report's train time.


rule predict_experiment:
    input:
        config=EFFECTIVE_CONFIG,
        dataset=dataset_manifest,
    output:
        json=PREDICTION,
        md="results/{site}/{experiment}/predict.md",
    log:
        "results/{site}/{experiment}/logs/predict.log",
    conda:
        ENV
    shell:
        "firescale predict experiment {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --config {input.config:q} --json {output.json:q} --markdown {output.md:q} > {log:q} 2>&1"


rule calibrate:
    input:
        baseline=lambda wc: RUN_RESULT.format(site=wc.site, experiment=wc.experiment, point="baseline"),
    output:
        CALIBRATION,
    log:
        "results/{site}/{experiment}/logs/calibrate.log",
    params:
        extra=lambda wc: PLAN.calibration_options(wc.experiment),
    conda:
        ENV
    shell:
        "firescale predict calibrate --site {wildcards.site:q} --record {input.baseline:q} {params.extra}"
        " --out {output:q} > {log:q} 2>&1"


rule predict_calibrated:
    input:
        config=EFFECTIVE_CONFIG,
        dataset=dataset_manifest,
        calibration=CALIBRATION,
    output:
        json="results/{site}/{experiment}/predict-calibrated.json",
        md="results/{site}/{experiment}/predict-calibrated.md",
    log:
        "results/{site}/{experiment}/logs/predict-calibrated.log",
    conda:
        ENV
    shell:
        "firescale predict experiment {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --config {input.config:q} --calibration {input.calibration:q}"
        " --json {output.json:q} --markdown {output.md:q} > {log:q} 2>&1"
