"""The performance model: layer accounting, allreduce costs, Paleo and DAG iteration models, traces."""
