"""Slurm's daemons on the virtual hosts: slurmctld on the controller's, one slurmd per node, each started
through `enter`, found by its pid file; the controller asked for the nodes' states."""
from __future__ import annotations

import subprocess
import time

from firescale.testing.layout import CONTROLLER_HOST, ClusterLayout, VClusterError
from firescale.testing.processes import read_pid

# The node states in which a node takes jobs (sinfo's %T; a trailing * means "not responding yet").
USABLE = ("idle", "mixed", "allocated", "completing")


def start_daemon(layout: ClusterLayout, host: str, daemon: str, *args: str) -> None:
    """Start a daemon on `host` (`enter` gives it the host's namespace and SLURM_CONF)."""
    proc = subprocess.run([str(layout.enter), host, daemon, *args], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise VClusterError(f"vcluster {layout.name}: {daemon} on {host} did not start "
                            f"({(proc.stderr or proc.stdout).strip()}); see {layout.logs}")


def start_slurmd(layout: ClusterLayout, node: str) -> None:
    start_daemon(layout, node, "slurmd", "-N", node)


def start_daemons(layout: ClusterLayout) -> None:
    """slurmctld (-i: without its saved state), then every node's slurmd."""
    start_daemon(layout, CONTROLLER_HOST, "slurmctld", "-i")
    for node in layout.node_names:
        start_slurmd(layout, node)


def daemon_pids(layout: ClusterLayout) -> dict[str, int | None]:
    """The live pid of each host's daemon (None when it is not running), also of nodes beyond `nodes`."""
    pids: dict[str, int | None] = {CONTROLLER_HOST: read_pid(layout.pidfile("slurmctld", CONTROLLER_HOST))}
    pids.update({n: read_pid(layout.pidfile("slurmd", n)) for n in layout.node_names})
    for extra in layout.root.glob("slurmd-*.pid") if layout.root.is_dir() else []:
        pids.setdefault(extra.stem.removeprefix("slurmd-"), read_pid(extra))
    return pids


def node_states(layout: ClusterLayout) -> dict[str, str]:
    """Each node's state as sinfo reports it (empty when the controller does not answer, also when the
    cluster's files were never written)."""
    try:
        proc = subprocess.run(layout.client("sinfo", "-h", "-N", "-o", "%N %T"), capture_output=True,
                              text=True, timeout=20)
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return {}
    if proc.returncode:
        return {}
    return dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)


def all_usable(layout: ClusterLayout, states: dict[str, str]) -> bool:
    """Whether `states` names exactly the cluster's nodes, each one taking jobs."""
    return sorted(states) == sorted(layout.node_names) and all(s.rstrip("*") in USABLE for s in states.values())


def wait_usable(layout: ClusterLayout, timeout: float) -> None:
    """Return once Slurm has every node taking jobs; raise after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(layout)
        if all_usable(layout, states):
            return
        time.sleep(0.3)
    raise VClusterError(f"vcluster {layout.name}: nodes not idle after {timeout:.0f} s ({states or 'no answer'}); "
                        f"see {layout.logs}")
