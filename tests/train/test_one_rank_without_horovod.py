"""A one-rank run shuts Horovod down after set-up: the single-GPU baseline pays for no background thread."""
import json
import sys

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.mpi]

SCRIPT = """
import json, sys, types
import horovod.tensorflow as hvd
import tensorflow as tf
from firescale.train.trainer import set_up_ranks
rank = set_up_ranks(types.SimpleNamespace(threads=1))
x = tf.constant([1.5, -2.0])
summed = rank.sum([x])
out = {"size": rank.size, "horovod": hvd.is_initialized(), "identity": summed[0] is x,
       "numbers": rank.sum_numbers([3.0]).tolist(), "gathered": rank.gather_object("a")}
with open(f"{sys.argv[1]}/rank{rank.rank}.json", "w") as f:
    json.dump(out, f)
"""


def _run(run_ranks, tmp_path, n):
    out = tmp_path / f"np{n}"
    out.mkdir()
    run_ranks(n, [sys.executable, "-c", SCRIPT, str(out)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_one_rank_runs_without_horovods_background_thread(run_ranks, tmp_path):
    [one] = _run(run_ranks, tmp_path, 1)
    assert one == {"size": 1, "horovod": False, "identity": True, "numbers": [3.0], "gathered": ["a"]}
    two = _run(run_ranks, tmp_path, 2)
    assert [r["horovod"] for r in two] == [True, True] and [r["numbers"] for r in two] == [[6.0], [6.0]]
    assert [r["gathered"] for r in two] == [["a", "a"], ["a", "a"]] and not any(r["identity"] for r in two)
