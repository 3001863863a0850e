# Run one sweep point: submit its job (or run it here), watch it and its heartbeat, cancel it when it
# stalls, resubmit from its snapshot when walltime or a stall ends it, and collect its status file and result.


rule run_point:
    input:
        script=JOB_SCRIPT,
        point=POINT_FILE,
        dataset=dataset_manifest,
        prediction=ancient(PREDICTION),   # predicted before it is submitted; a new point's prediction is no reason to rerun
    output:
        result=RUN_RESULT,
        status=RUN_STATUS,
    log:
        "results/{site}/{experiment}/logs/run-{point}.log",
    conda:
        ENV
    shell:
        "firescale sweep run {wildcards.site:q} --script {input.script:q} --point-file {input.point:q}"
        " --prediction {input.prediction:q} --collect {output.result:q} {output.status:q} > {log:q} 2>&1"
