# The reproducibility report of one experiment: tables, plots and provenance.


rule experiment_report:
    input:
        lambda wc: PLAN.files(RUN_RESULT, wc.experiment),
    output:
        report(
            REPORT,
            caption="../report/speedup.rst",
            category="Speedup",
        ),
    log:
        "results/{site}/{experiment}/logs/report.log",
    params:
        results=lambda wc, input: parent(input[0], 2),
        out=lambda wc, output: parent(output[0]),
    conda:
        ENV
    shell:
        "firescale report {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --results {params.results:q} --out {params.out:q} > {log:q} 2>&1"
