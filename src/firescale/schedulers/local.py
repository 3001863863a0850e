"""No scheduler: the job script runs directly on this machine."""
from __future__ import annotations

from .base import Scheduler


class Local(Scheduler):
    name = "local"
    template = "local.sh.j2"
    hosts_command = "hostname"
    job_id_variable = ""
