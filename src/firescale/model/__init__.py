"""The performance model, pure arithmetic: layers, memory, allreduce costs, Paleo, the DAG model, splits, traces."""
