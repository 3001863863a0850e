# The reproducibility report of one experiment: tables, plots and provenance.


rule experiment_report:
    input:
        lambda wc: PLAN.files(RUN_RESULT, wc.experiment),
    output:
        report(
            REPORT_DIR + "/report.md",
            caption="../report/speedup.rst",
            category="Speedup",
        ),
    log:
        "results/{site}/{experiment}/logs/report.log",
    shell:
        "firescale report {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --results results/{wildcards.site}/{wildcards.experiment}/runs"
        " --out reports/{wildcards.site}/{wildcards.experiment} > {log:q} 2>&1"
