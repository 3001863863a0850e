"""How long a collective waits for a peer: a site's `collective_timeout:` keys and the variables a job exports for them.

A rank that stops (a deadlock, a GPU fallen off the bus, a hung mount) leaves its peers waiting in a collective.
Each library can give up instead of waiting for the walltime, and is told to here, in one table shared by the job
scripts and the trainer:

- torch.distributed's process-group timeout (Gloo and NCCL), which the trainer reads from
  FIRESCALE_COLLECTIVE_TIMEOUT_S; a Gloo collective then raises, and the trainer ends naming it.  On GPUs,
  NCCL's watchdog ends the ranks when a collective passes it (TORCH_NCCL_ASYNC_ERROR_HANDLING=1: tear down),
  naming the collective (its WorkNCCL's OpType and sequence number) in the job's log.
- Horovod's stall check: it names the ranks that have not joined a collective after
  HOROVOD_STALL_CHECK_TIME_SECONDS, and shuts down after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, which ends the job.
  It covers a rank alive but missing from a collective; a rank stopped outright blocks Horovod's negotiation.

The pytorch backend's MPI process group (train/torch/mpi_group.py) has no timeout of its own: there, and for
a stopped rank under Horovod, the runner's stall watch on the heartbeat (jobs/stall.py) ends a stuck job.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from firescale.frameworks import framework as framework_named

if TYPE_CHECKING:
    from firescale.cluster.site import SiteProfile

COLLECTIVE_TIMEOUT_VARIABLE = "FIRESCALE_COLLECTIVE_TIMEOUT_S"
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0   # the site schema's default of collective_timeout.seconds
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
HOROVOD_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


def timeout_environment(settings: Mapping[str, Any], framework: str, gpu: bool) -> dict[str, str]:
    """The variables a job of `framework` exports for a site's validated `collective_timeout:` mapping: the
    process group's timeout (and on GPUs NCCL's async error handling) for torch.distributed, the stall check for
    Horovod (the registry's `collective_timeout` says which a framework takes)."""
    if framework_named(framework).collective_timeout == "process_group":
        env = {COLLECTIVE_TIMEOUT_VARIABLE: f"{int(settings['seconds'])}"}
        if gpu:
            env[NCCL_ASYNC_ERROR_HANDLING] = "1"   # 1: the watchdog tears the process down (torch's TearDown)
        return env
    return {HOROVOD_STALL_CHECK: f"{int(settings['horovod_stall_check_seconds'])}",
            HOROVOD_STALL_SHUTDOWN: f"{int(settings['horovod_stall_shutdown_seconds'])}"}


def site_timeout_environment(site: SiteProfile, framework: str) -> dict[str, str]:
    """What a site's job of `framework` exports so that a stuck collective gives up (timeout_environment)."""
    return timeout_environment(site.config["collective_timeout"], framework, site.device_kind == "gpu")
