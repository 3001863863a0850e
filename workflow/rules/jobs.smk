# Render one job script per sweep point from the site's scheduler template.


rule render_job:
    input:
        point=POINT_DESCRIPTION,   # what this point's job depends on; not the experiment's other points
        dataset=dataset_manifest,  # a point's max_iter from its epochs needs the training-set size
    output:
        script=JOB_SCRIPT,
        point=POINT_FILE,
    log:
        "results/{site}/{experiment}/logs/render-{point}.log",
    params:
        config=lambda wc: EXPERIMENT_CONFIG.format(site=wc.site, experiment=wc.experiment),
    conda:
        ENV
    shell:
        "firescale site render {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --point {wildcards.point:q} --config {params.config:q} --out {output.script:q} > {log:q} 2>&1"
