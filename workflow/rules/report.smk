# The reproducibility report of one experiment: tables, plots and provenance.
# report.md is written last, so its presence means the rest is there too.


rule experiment_report:
    input:
        runs=lambda wc: PLAN.files(RUN_RESULT, wc.experiment),
        config=EXPERIMENT_CONFIG,
        predictions="results/{site}/{experiment}/predict-calibrated.json",
    output:
        md=REPORT,
        html=report("reports/{site}/{experiment}/report.html", caption="../report/speedup.rst", category="Report"),
        csv=report("reports/{site}/{experiment}/report.csv", caption="../report/speedup.rst", category="Tables"),
        tex="reports/{site}/{experiment}/report.tex",
        json="reports/{site}/{experiment}/report.json",
        speedup=report("reports/{site}/{experiment}/speedup.png", caption="../report/speedup.rst", category="Plots"),
        accuracy=report("reports/{site}/{experiment}/accuracy_vs_time.png", caption="../report/accuracy.rst", category="Plots"),
        split=report("reports/{site}/{experiment}/time_split.png", caption="../report/time_split.rst", category="Plots"),
        memory=report("reports/{site}/{experiment}/memory.png", caption="../report/memory.rst", category="Plots"),
        by_batch=report("reports/{site}/{experiment}/accuracy_by_batch.png", caption="../report/accuracy_by_batch.rst", category="Plots"),
    log:
        "results/{site}/{experiment}/logs/report.log",
    params:
        results=lambda wc, input: parent(input.runs[0], 2),
        out=lambda wc, output: parent(output.md),
    conda:
        ENV
    shell:
        "firescale report {wildcards.site:q} --experiment {wildcards.experiment:q}"
        " --results {params.results:q} --out {params.out:q} --config {input.config:q}"
        " --predictions {input.predictions:q} --store site"
        " > {log:q} 2>&1"


# One paper-style table of each experiment that has runs on more than one site, from the sites' results
# stores (the report rule adds each site's runs to its store); index.md is written last.
rule results_table:
    input:
        reports=report_files(),
        config=ALL_EXPERIMENTS_CONFIG,
    output:
        index="reports/tables/index.md",
    log:
        "results/{site}/logs/results-table.log".format(site=SITE),
    params:
        out=lambda wc, output: parent(output.index),
    conda:
        ENV
    shell:
        "firescale results table --experiment all --config {input.config:q} --out {params.out:q} > {log:q} 2>&1"
