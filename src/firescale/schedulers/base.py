"""The Scheduler interface: the directives of a job script, and the shell that lists its hosts."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..render import JobSpec
    from ..site import SiteProfile


class Scheduler:
    """Gets the allocation; a Launcher then places ranks inside it."""

    name = "base"
    template = "local.sh.j2"
    # Shell (trusted, from this code, not from profiles) that prints the allocation's hostnames, one a line.
    hosts_command = "hostname"
    # The variable holding the job's id inside the job, if the scheduler sets one.
    job_id_variable = ""

    def directives(self, site: "SiteProfile", job: "JobSpec") -> list[str]:
        """Directive lines (with their prefix), sorted, for the top of the job script."""
        return []
