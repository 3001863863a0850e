"""slurm.conf for the Slurms the tests start (one node on localhost, or the virtual cluster): no munge, no
accounting, every daemon run by root, all state and logs under one folder."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PARTITION = "debug"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818


@dataclass(frozen=True)
class SlurmNode:
    """A compute node as slurm.conf declares it."""

    name: str
    address: str
    cpus: int
    memory_mb: int


def slurm_conf(*, cluster: str, controller: str, controller_address: str, nodes: Sequence[SlurmNode],
               folder: Path, ctld_port: int = SLURMCTLD_PORT, slurmd_port: int = SLURMD_PORT,
               several_slurmd: bool = False, kill_wait_s: int | None = None,
               slurmd_timeout_s: int | None = None, comment: str | None = None) -> str:
    """The text of slurm.conf: state, spool, pid files and logs under `folder`, every node in one default
    partition, `debug`.

    `several_slurmd`: the nodes' slurmd all run on this machine (each in a namespace of its own), so each
    node's spool, pid file, log and TmpFS carry its name (%n), and slurmd takes a node's CPUs from here
    rather than from the machine.  `kill_wait_s` and `slurmd_timeout_s` set KillWait and SlurmdTimeout
    (Slurm's defaults when None); a short SlurmdTimeout declares a lost node down in seconds.
    `comment` becomes the first line.
    """
    per_node = "-%n" if several_slurmd else ""
    lines = [f"# {comment}"] if comment else []
    lines += [
        f"ClusterName={cluster}",
        f"SlurmctldHost={controller}({controller_address})",
        "AuthType=auth/none",
        "CredType=cred/none",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool" + ("/%n" if several_slurmd else ""),
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd{per_node}.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log",
        f"SlurmdLogFile={folder}/log/slurmd{per_node}.log",
        *([f"TmpFS={folder}/tmp/%n"] if several_slurmd else []),
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        *(["SlurmdParameters=config_overrides"] if several_slurmd else []),
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=600",
    ]
    if kill_wait_s is not None:
        lines.append(f"KillWait={kill_wait_s}")
    if slurmd_timeout_s is not None:
        lines += ["# a node whose slurmd is gone is declared down (and its jobs NODE_FAIL) in seconds, not minutes",
                  f"SlurmdTimeout={slurmd_timeout_s}"]
    lines += [f"NodeName={n.name} NodeAddr={n.address} CPUs={n.cpus} RealMemory={n.memory_mb} State=UNKNOWN"
              for n in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(n.name for n in nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
