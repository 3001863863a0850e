"""Schedulers by name: each knows its directives (pure string building) and, apart, how to submit and poll."""
from __future__ import annotations

import importlib

from ..errors import FirescaleError
from .base import JobState, Runner, Scheduler, prefixed, run_command

# name -> "module:Class", imported only when asked for.
SCHEDULERS = {
    "slurm": "firescale.schedulers.slurm:Slurm",
    "pbs": "firescale.schedulers.pbs:PBS",
    "torque": "firescale.schedulers.pbs:Torque",
    "local": "firescale.schedulers.local:Local",
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
