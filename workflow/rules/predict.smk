# Predict every point before anything is submitted (Paleo's model with the site's devices and
# interconnect), calibrate in a job once the baseline has run, and predict again for the report: each
# point's whole fixed-epoch budget, the report's train time.


rule predict_experiment:
    input:
        config=EXPERIMENT_CONFIG,
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


rule render_calibration_job:
    input:
        config=EXPERIMENT_CONFIG,
    output:
        CALIBRATION_JOB,
    log:
        "results/{site}/{experiment}/logs/render-calibration.log",
    conda:
        ENV
    shell:
        "firescale site render {wildcards.site:q} --experiment {wildcards.experiment:q} --calibration"
        " --config {input.config:q} --out {output:q} > {log:q} 2>&1"


# From every repeat of the baseline: its run again at a smaller batch, once alone and once for each rank
# of a node at once, and Horovod's allreduce over the sweep's most ranks: measured in a job on the site's
# nodes, as the points run; or the site's kept calibration of the same key, reused without a job
# (`--config recalibrate=True` measures afresh).
rule calibrate:
    input:
        script=CALIBRATION_JOB,
        config=EXPERIMENT_CONFIG,
        baselines=lambda wc: baseline_results(wc.experiment),
    output:
        CALIBRATION,
    log:
        "results/{site}/{experiment}/logs/calibrate.log",
    params:
        recalibrate=["--recalibrate"] if config.get("recalibrate") else [],
    conda:
        ENV
    shell:
        "firescale sweep calibrate {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --config {input.config:q} --script {input.script:q} --out {output:q} {params.recalibrate:q}"
        " > {log:q} 2>&1"


# The report's predictions: calibrated, or for an experiment with `calibrate: false` the uncalibrated model's
# (the file's `calibrated` is false and the report says so).
rule predict_calibrated:
    input:
        config=EXPERIMENT_CONFIG,
        dataset=dataset_manifest,
        calibration=calibration_of,
    output:
        json="results/{site}/{experiment}/predict-calibrated.json",
        md="results/{site}/{experiment}/predict-calibrated.md",
    log:
        "results/{site}/{experiment}/logs/predict-calibrated.log",
    params:
        calibration=lambda wc, input: ["--calibration", input.calibration] if input.calibration else [],
    conda:
        ENV
    shell:
        "firescale predict experiment {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --config {input.config:q} {params.calibration:q}"
        " --json {output.json:q} --markdown {output.md:q} > {log:q} 2>&1"
