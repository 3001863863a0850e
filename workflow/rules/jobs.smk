# Render one job script per sweep point from the site's scheduler template.


rule render_job:
    input:
        config=EFFECTIVE_CONFIG,
        dataset=dataset_manifest,  # a point's max_iter from its epochs needs the training-set size
    output:
        script=JOB_SCRIPT,
        point=POINT_FILE,
    log:
        "results/{site}/{experiment}/logs/render-{point}.log",
    conda:
        ENV
    shell:
        "firescale site render {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --point {wildcards.point:q} --config {input.config:q} --out {output.script:q} > {log:q} 2>&1"
