"""The run record's collective library: what Horovod said after hvd.init(), on real MPI ranks."""
from __future__ import annotations

import json
import sys

import pytest

from firescale.cluster.horovod_build import collective_library

pytestmark = [pytest.mark.mpi]

PROBE = """
import json, pathlib, sys, horovod.tensorflow as hvd
from firescale.cluster.horovod_build import collectives_record
hvd.init()
pathlib.Path(sys.argv[1], f"record-{hvd.rank()}.json").write_text(json.dumps(collectives_record(hvd, "CPU:0")))
"""


def test_horovod_s_order_picks_the_library():
    assert collective_library(device="GPU:0", mpi_enabled=True, gloo_enabled=False, nccl_built=True) == "NCCL"
    assert collective_library(device="GPU:0", mpi_enabled=True, gloo_enabled=False, nccl_built=False) == "MPI"
    assert collective_library(device="CPU:0", mpi_enabled=True, gloo_enabled=True, nccl_built=True) == "Gloo"
    assert collective_library(device="CPU:0", mpi_enabled=False, gloo_enabled=False, nccl_built=False) == "none"


@pytest.mark.tensorflow
def test_two_ranks_on_gloo_record_gloo(run_ranks, tmp_path):
    """MPI starts the ranks and Gloo sums (the MPI case is the trainer's record, tests/train/test_trainer_mpi.py).
    Each rank writes its own file: the two ranks' lines on one standard output can interleave."""
    run_ranks(2, [sys.executable, "-c", PROBE, str(tmp_path)], env={"HOROVOD_CPU_OPERATIONS": "GLOO"}, timeout=180)
    records = [json.loads((tmp_path / f"record-{r}.json").read_text()) for r in range(2)]
    assert len(records) == 2
    for record in records:
        assert record == {"library": "Gloo", "gpu_operations": None, "mpi_enabled": True, "gloo_enabled": True,
                          "nccl_built": False}
