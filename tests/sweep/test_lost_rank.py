"""The first rank a launcher reports dead, read from job logs as srun and Open MPI's mpirun write them."""
from __future__ import annotations

from firescale.jobs.outcome import first_lost_rank

SRUN_LOG = """\
  Local host: n1
  Peer host:  n2
--------------------------------------------------------------------------
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.0
srun: error: n1: task 0: Terminated
srun: Force Terminated StepId=1.0
firescale: job fs-node-loss ended with exit code 143
"""

MPIRUN_LOG = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node n2 exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""


def test_srun_names_the_task_that_died_first_not_the_ones_it_terminated():
    assert first_lost_rank(SRUN_LOG) == "rank 1 on n2: Killed"


def test_srun_exit_codes_and_task_ranges():
    assert first_lost_rank("srun: error: n7: tasks 4-7: Exited with exit code 3\n") == \
        "rank 4-7 on n7: Exited with exit code 3"


def test_mpirun_names_rank_node_and_signal():
    assert first_lost_rank(MPIRUN_LOG) == "rank 1 on n2: exited on signal 9 (Killed)"


def test_a_log_without_a_lost_rank_says_nothing():
    assert first_lost_rank("firescale: job x ended with exit code 1\nTraceback (most recent call last):\n") == ""


def test_ranks_srun_terminated_after_a_node_failure_are_not_named_as_lost():
    # A node lost whole: srun stops the ranks left on the other nodes with TERM and says which node failed
    log = ("srun: error: Node failure on n2\nsrun: error: n1: task 0: Terminated\n"
           "srun: Force Terminated StepId=3.0\n")
    assert first_lost_rank(log) == "node n2 (node failure)"
    assert first_lost_rank("srun: error: n1: task 0: Terminated\nsrun: Force Terminated StepId=3.0\n") == ""
