"""Schedulers by name: each knows its directives (pure string building) and, apart, how to submit and poll."""
from __future__ import annotations

import importlib

from firescale.errors import FirescaleError
from firescale.jobs.schedulers.base import JobState, Runner, Scheduler, prefixed, run_command

# name -> "module:Class", imported only when asked for.
SCHEDULERS = {
    "slurm": "firescale.jobs.schedulers.slurm:Slurm",
    "pbs": "firescale.jobs.schedulers.pbs:PBS",
    "torque": "firescale.jobs.schedulers.pbs:Torque",
    "local": "firescale.jobs.schedulers.local:Local",
}


def get_scheduler(name: str, runner: Runner = run_command) -> Scheduler:
    """The scheduler registered as `name`; an unknown name lists the known ones."""
    try:
        target = SCHEDULERS[name]
    except KeyError:
        raise FirescaleError(f"unknown scheduler {name!r}; known schedulers: {', '.join(sorted(SCHEDULERS))}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(runner)


__all__ = ["SCHEDULERS", "JobState", "Runner", "Scheduler", "get_scheduler", "prefixed", "run_command"]
