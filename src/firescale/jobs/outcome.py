"""How an ended job went: succeeded, resubmit (walltime or preemption only) or failed, with the scheduler's reason.

Only three things send a point back to the queue: the scheduler's TIMEOUT, its PREEMPTED, and the
site's walltime signal received within its lead time of the walltime (the job's own status file says
which signal came and when).  A user's cancel, an out-of-memory kill, a lost rank, a node failure
(unless the site asks for NODE_FAIL to be resubmitted) and every other failure fail the point, with
the scheduler's words for why.  Exit codes alone never resubmit: 143 is also what a cancelled or
OOM-killed step returns.
"""
from __future__ import annotations

import datetime as dt
import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from firescale.cluster.site import parse_walltime
from firescale.frameworks import DEFAULT_FRAMEWORK
from firescale.jobs.schedulers.base import CANCELLED, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, TIMEOUT, UNKNOWN, JobState

if TYPE_CHECKING:
    from firescale.cluster.site import SiteProfile

FINISHED_RESULTS = ("finished", "target_reached")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass
class Verdict:
    outcome: str  # succeeded | resubmit | failed
    reason: str = ""


@dataclass(frozen=True)
class ResubmitRules:
    """What may send one point's job back to the queue."""

    walltime_s: int | None = None  # the job's walltime; None where there is none (no scheduler)
    signal: str = ""               # the site's walltime signal for the job (USR1, or USR2 where NCCL runs)
    lead_s: int = 0                # sent this many seconds before the walltime ends
    early_s: int = 60              # how much earlier the scheduler may send it (Slurm: up to 60 s)
    node_fail: bool = False        # the site resubmits a job a failed node ended

    @classmethod
    def for_site(cls, site: SiteProfile, walltime: str, framework: str = DEFAULT_FRAMEWORK) -> ResubmitRules:
        """The site's walltime signal for a job of `framework` against a point's walltime, and its NODE_FAIL choice."""
        if site.scheduler == "local":
            return cls()
        name, lead = site.walltime_signal(framework)
        return cls(walltime_s=parse_walltime(walltime), signal=name, lead_s=lead, node_fail=site.resubmit_on_node_fail)


def _seconds(a: str | None, b: str | None) -> float | None:
    try:
        return (dt.datetime.strptime(str(b), TIME_FORMAT) - dt.datetime.strptime(str(a), TIME_FORMAT)).total_seconds()
    except ValueError:
        return None


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def exit_code_words(code: int) -> str:
    """`exit code N`, with the signal that killed it when N is 128 + a signal number."""
    if 128 < code < 128 + 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return f"exit code {code}"
        hint = " (the out-of-memory killer, or a rank's loss)" if name == "SIGKILL" else ""
        return f"exit code {code}, killed by {name}{hint}"
    return f"exit code {code}"


def walltime_signal(status: dict[str, Any], rules: ResubmitRules) -> tuple[bool, str]:
    """Whether the job stopped for the site's walltime signal, within its lead time; and the words for it."""
    name = str(status.get("signal") or "")
    if not name:
        return False, ""
    after = _seconds(status.get("start"), status.get("signal_time"))
    when = f" {_clock(after)} after the job started" if after is not None else ""
    if rules.walltime_s is None or not rules.signal:
        return False, f"SIG{name}{when} (this site has no walltime signal)"
    due = rules.walltime_s - rules.lead_s
    if name != rules.signal:
        return False, f"SIG{name}{when}, not the walltime signal SIG{rules.signal}"
    if after is None:
        return False, f"SIG{name} at a time status.json does not record"
    if after < due - rules.early_s:
        return False, f"SIG{name}{when}, before the walltime signal was due ({_clock(due)})"
    return True, f"the walltime signal SIG{name}{when} (due at {_clock(due)}, walltime {_clock(rules.walltime_s)})"


def decide(status: dict[str, Any] | None, state: JobState, finished: bool, rules: ResubmitRules,
           *, missing: str = "training wrote no finished result.json") -> Verdict:
    """From the job's own status file, whether it left its finished result, and the scheduler's confirmed last
    word; `missing` says what is missing when the job exited 0 without that result."""
    why = state.words()
    code = None if status is None else int(status.get("exit_code", -1))
    if code == 0 and finished:
        return Verdict("succeeded")
    if state.state == UNKNOWN:
        return Verdict("failed", f"the scheduler stopped answering about the job ({state.raw})")
    if state.state == CANCELLED:
        return Verdict("failed", f"cancelled by a user or an administrator (scheduler state {why})")
    if state.state == OUT_OF_MEMORY:
        return Verdict("failed", f"out of memory (scheduler state {why})")
    if state.state == NODE_FAIL:
        if rules.node_fail:
            return Verdict("resubmit", f"a node of the job failed ({why}); the site resubmits such jobs")
        return Verdict("failed", f"a node of the job failed (scheduler state {why}); "
                                 "set the site's limits.resubmit_on_node_fail to resubmit such points")
    if state.state in (TIMEOUT, PREEMPTED):
        return Verdict("resubmit", f"ended by {why}; resuming from the newest snapshot")
    if status is None or code is None:
        return Verdict("failed", f"the job ended (scheduler state {why}) without writing status.json")
    is_walltime, words = walltime_signal(status, rules)
    if is_walltime and finished:
        # The signal came after the last iteration, while the job was ending: nothing is left to resume.
        return Verdict("succeeded", f"training finished before {words} ended the job")
    if is_walltime:
        return Verdict("resubmit", f"stopped by {words}; resuming from the newest snapshot")
    if words:
        return Verdict("failed", f"stopped by {words}: a request to stop, not the walltime; "
                                 f"{exit_code_words(code)}, scheduler state {why}")
    if code == 0:
        return Verdict("failed", f"exit code 0 but {missing}")
    because = f": {status['reason']}" if status.get("reason") else ""  # the job's own words, when it has them
    return Verdict("failed", f"{exit_code_words(code)} (status.json), scheduler state {why}{because}")


# How launchers name the first rank that died: srun ("srun: error: n2: task 1: Killed") and Open MPI's
# mpirun, also under horovodrun ("mpirun noticed that process rank 1 with PID 0 on node n2 exited on
# signal 9 (Killed).").  The first such line names the culprit; the others follow from it.
_SRUN_TASK = re.compile(r"^srun: error: (?P<host>[^:\s]+): tasks? (?P<task>[0-9,\-\[\]]+): (?P<what>.+)$")
_SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on (?P<host>[^\s,]+)")
_MPIRUN_RANK = re.compile(r"mpirun noticed that process rank (?P<task>\d+) with PID \d+ on node (?P<host>\S+) "
                          r"(?P<what>exited on signal \d+ \([^)]*\)|exited with status \d+)")


def first_lost_rank(log_text: str) -> str:
    """'rank 1 on n2: Killed' for the first rank the launcher reports dead in a job log, 'node n2 (node
    failure)' for a node srun lost, else ''.  srun ends the ranks that survive a loss with TERM: a rank
    `Terminated` is one the launcher stopped, never the one lost first, so it is not named."""
    for line in log_text.splitlines():
        if node := _SRUN_NODE_FAIL.match(line.strip()):
            return f"node {node['host']} (node failure)"
        match = _SRUN_TASK.match(line.strip()) or _MPIRUN_RANK.search(line)
        if match and not match["what"].startswith("Terminated"):
            return f"rank {match['task']} on {match['host']}: {match['what'].rstrip('.')}"
    return ""


def without_progress(verdict: Verdict, attempt: int, before: int | None, after: int | None) -> Verdict | None:
    """A failed verdict when a resubmit-worthy attempt left no newer snapshot (it would loop), else None."""
    if after is not None and (before is None or after > before):
        return None
    newest = "none" if before is None else f"the one at iteration {before}"
    return Verdict("failed", f"{verdict.reason.split(';')[0]}, but attempt {attempt} wrote no snapshot newer than "
                             f"{newest}; a resubmission would repeat it, so the point stops here "
                             "(is the walltime long enough to start, train and snapshot?)")
