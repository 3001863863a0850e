# Ingest each experiment's dataset into LMDB and HDF5 on the site's shared filesystem.


def ingest_source(wildcards):
    for experiment in EXPERIMENTS:
        dataset = PLAN.dataset(experiment)
        if dataset["name"] == wildcards.dataset:
            return dataset["source"]
    raise ValueError(f"no experiment uses dataset {wildcards.dataset}")


rule ingest:
    output:
        manifest=str(PLAN.site.paths.datasets.resolve()) + "/{dataset}/manifest.json",
    log:
        "results/{site}/logs/ingest-{{dataset}}.log".format(site=SITE),
    params:
        source=ingest_source,
        root=str(PLAN.site.paths.datasets.resolve()),
    shell:
        "firescale data ingest --source {params.source:q} --name {wildcards.dataset:q}"
        " --out {params.root:q} > {log:q} 2>&1"
