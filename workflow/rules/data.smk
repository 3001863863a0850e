# Ingest each experiment's dataset into LMDB and HDF5 on the site's shared filesystem.


rule ingest:
    output:
        manifest=DATASET_MANIFEST,
    log:
        "results/logs/ingest-{dataset}.log",
    params:
        source=lambda wc: PLAN.dataset_source(wc.dataset),
        root=lambda wc, output: parent(output.manifest, 2),
    conda:
        ENV
    shell:
        "firescale data ingest --source {params.source:q} --name {wildcards.dataset:q}"
        " --out {params.root:q} > {log:q} 2>&1"
