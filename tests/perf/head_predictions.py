"""The grid of shipped-site predictions kept in data/one_link_predictions.json from before two-level links.

It uses only what the model offered before them, so the same file regenerates the data from that commit:

    git archive COMMIT src | tar -x -C /tmp/head
    PYTHONPATH=/tmp/head/src .venv/bin/python tests/perf/head_predictions.py COMMIT \
        > tests/perf/data/one_link_predictions.json
"""
from __future__ import annotations

import json
import sys

SITES = ("local", "vcluster", "titan", "ib-cluster")
NETS = ("lenet_same", "nin", "alexnet")
GPUS = (1, 2, 3, 4, 8, 16, 32)
BATCHES = (64, 1024)
FIELDS = ("comm_s", "iteration_sequential_s", "iteration_overlap_s", "iteration_s", "speedup", "comm_algorithm")


def _as_named_there(net: str) -> str:
    """The net's name in the source that runs: the padded LeNet was `lenet` until Caffe's own LeNet took that name."""
    from firescale.nets.zoo import is_known_net

    return "lenet" if net == "lenet_same" and not is_known_net(net) else net


def grid(load=None) -> list[dict]:
    """Every site, net, rank count, batch and schedule of the grid, with the prediction's FIELDS; `load(name)`
    gives a site (default: the shipped one)."""
    from firescale.cluster.site import load_site
    from firescale.model.paleo import predict_point

    rows = []
    for name in SITES:
        site = (load or load_site)(name)
        for net in NETS:
            for gpus in GPUS:
                for batch in BATCHES:
                    for overlap in (False, True):
                        p = predict_point(site, _as_named_there(net), gpus, batch, overlap=overlap).to_dict()
                        rows.append({"site": name, "net": net, "gpus": gpus, "batch": batch, "overlap": overlap,
                                     **{k: p[k] for k in FIELDS}})
    return rows


if __name__ == "__main__":
    rows = ",\n  ".join(json.dumps(r) for r in grid())   # one point a line
    head = json.dumps({"commit": sys.argv[1], "command": "tests/perf/head_predictions.py"})[:-1]
    sys.stdout.write(f'{head},\n "rows": [\n  {rows}]}}\n')
