"""A virtual multi-node Slurm cluster on one machine: each node a network namespace with its own address,
hostname and slurmd, the controller in another; started and stopped by firescale (root only).

Its names and files are in `layout`; bringing it up takes the steps of `host_files` (slurm.conf and the
scripts), `cpusets`, `namespaces` (the network) and `daemons`, in that order.

Slurm's clients reach the controller only from inside a namespace: `DIR/enter ctl sbatch ...`, or the
client shims in `DIR/bin` (sbatch, squeue, sacct, scancel, scontrol, sinfo, srun) that do just that.
There is no sshd: `DIR/ssh-bin/ssh HOST CMD` runs CMD on HOST in a fresh login environment, for
launchers that insist on ssh (horovodrun, mpirun without Slurm integration).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from firescale.testing import daemons
from firescale.testing.cpusets import make_cpusets, remove_cpusets
from firescale.testing.host_files import vcluster_slurm_conf, write_host_files
from firescale.testing.layout import CONTROLLER_HOST, DEFAULT_ROOT, ClusterLayout, VClusterError, bridge_first
from firescale.testing.namespaces import (
    check_link_rate,
    delete_namespace,
    link_rate,
    make_network,
    named_namespaces,
    namespace_refusal,
    processes_in,
    shape_link,
)
from firescale.testing.processes import alive, read_pid, send_signal

_DAEMONS = ("slurmctld", "slurmd")
_SYSTEM_TOOLS = ("ip", "tc", "nsenter", "unshare", "taskset")
STOP_WAIT_S = 10  # from SIGTERM to SIGKILL when the cluster goes down


@dataclass(frozen=True)
class VirtualCluster(ClusterLayout):
    """The cluster laid out by `ClusterLayout`, brought up, asked about and torn down."""

    # --- state
    def existing_namespaces(self) -> list[str]:
        """This cluster's namespaces that exist, also nodes beyond `nodes` (left by a larger bring-up)."""
        return sorted((ns for ns in named_namespaces() if self.is_own_namespace(ns)), key=bridge_first)

    def daemon_pids(self) -> dict[str, int | None]:
        """The live pid of each host's daemon, None where it is not running."""
        return daemons.daemon_pids(self)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it (empty when the controller does not answer)."""
        return daemons.node_states(self)

    def link_rates(self) -> dict[str, str]:
        """Each node's sending rate as shaped by `shape_links` ("unshaped" when it is not)."""
        return {n: link_rate(self.namespace(n)) for n in self.node_names if self.namespace(n) in named_namespaces()}

    def shape_links(self, gbits: float | None) -> None:
        """Limit every node's sending to `gbits` Gbit/s, or lift the limit (None); the cluster stays up."""
        if gbits is not None:
            check_link_rate(gbits)
        missing = [n for n in self.node_names if self.namespace(n) not in named_namespaces()]
        if missing:
            raise VClusterError(f"vcluster {self.name}: nodes {', '.join(missing)} are not up; "
                                "run `firescale vcluster up` first")
        for node in self.node_names:
            shape_link(self.namespace(node), gbits)

    def node_cpus(self) -> dict[str, int]:
        """The CPUs slurm.conf on disk gives each node (empty before the first bring-up)."""
        text = self.conf.read_text() if self.conf.is_file() else ""
        return {m[1]: int(m[2]) for m in re.finditer(r"^NodeName=(\S+) .*\bCPUs=(\d+)", text, re.M)}

    def runs_this_conf(self) -> bool:
        """Whether the slurm.conf the daemons read is the one this layout writes."""
        return self.conf.is_file() and self.conf.read_text() == vcluster_slurm_conf(self)

    def is_up(self) -> bool:
        if self.existing_namespaces() != sorted(self.namespaces(), key=bridge_first):
            return False
        if any(pid is None for pid in self.daemon_pids().values()):
            return False
        return daemons.all_usable(self, self.node_states())

    # --- its clients, from outside it
    def clients_first(self, path: str, user: str) -> str:
        """`path` (a PATH) with the cluster's Slurm client shims first: how a process outside the cluster (a
        command that starts ranks with srun) reaches its controller.  One sentence saying what to run when the
        cluster is not up, or when its nodes have fewer CPUs than `cpus_per_node`; `user` (a site) needs it."""
        if not (self.bin / "srun").is_file() or read_pid(self.pidfile("slurmctld", CONTROLLER_HOST)) is None:
            raise VClusterError(f"{user} runs on the virtual cluster in {self.root}, which is not up; start it with "
                                f"`{self.up_command()}` (as root)")
        short = sorted(n for n, cpus in self.node_cpus().items() if cpus < self.cpus_per_node)
        if short:
            raise VClusterError(f"{user} runs {self.cpus_per_node} ranks a node on the virtual cluster in {self.root}, "
                                f"whose node {short[0]} has {self.node_cpus()[short[0]]} CPU(s); restart it with "
                                f"`{self.up_command()}` (as root)")
        return os.pathsep.join([str(self.bin), *([path] if path else [])])

    def up_command(self) -> str:
        """The command that brings this cluster up, with the options where it differs from their defaults."""
        default = ClusterLayout(root=DEFAULT_ROOT)
        options = [f"--dir {self.root}" if self.root != default.root else "",
                   f"--nodes {self.nodes}" if self.nodes != default.nodes else "",
                   f"--cpus-per-node {self.cpus_per_node}" if self.cpus_per_node != default.cpus_per_node else "",
                   f"--name {self.name}" if self.name != default.name else ""]
        return " ".join(["firescale vcluster up", *filter(None, options)])

    # --- bring-up
    def up(self, timeout: float = 60) -> None:
        """Start the cluster; a no-op when it is already up as laid out, a clean restart when half up or up
        with another slurm.conf (another count of CPUs a node)."""
        check_machine()
        if self.is_up() and self.runs_this_conf():
            return
        self.down()
        write_host_files(self)
        try:
            make_cpusets(self.cpusets, {n: self.core_of(n) for n in self.node_names})
            make_network(self)
            daemons.start_daemons(self)
            daemons.wait_usable(self, timeout)
        except BaseException:
            self.down()
            raise

    def restart_node(self, node: str, timeout: float = 60) -> None:
        """Start a node's slurmd again after it died, and wait until Slurm takes the node back."""
        daemons.start_slurmd(self, node)
        daemons.wait_usable(self, timeout)

    # --- tear-down
    def down(self) -> None:
        """Stop every process in the cluster's namespaces and delete the namespaces; safe to repeat."""
        pids = [p for p in self.daemon_pids().values() if p]
        inside = processes_in(self.existing_namespaces())
        for pid in [*pids, *inside]:
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and any(alive(p) for p in [*pids, *inside]):
            time.sleep(0.1)
        for pid in processes_in(self.existing_namespaces()):
            send_signal(pid, signal.SIGKILL)
        for ns in reversed(self.existing_namespaces()):
            delete_namespace(ns)
        for daemon_file in self.root.glob("*.pid") if self.root.is_dir() else []:
            daemon_file.unlink(missing_ok=True)
        remove_cpusets(self.cpusets)
        leftover = self.existing_namespaces()
        if leftover:
            raise VClusterError(f"vcluster {self.name}: could not delete namespaces {', '.join(leftover)}")


def remove_abandoned_clusters(prefix: str, root: Path) -> None:
    """Tear down clusters named PREFIX<pid> whose process is gone (a test session killed before its
    tear-down); their files go under `root`."""
    for ns in named_namespaces():
        match = re.fullmatch(rf"({re.escape(prefix)}([0-9]+))-ctl", ns)
        if match and not os.path.exists(f"/proc/{match[2]}"):
            VirtualCluster(root=root / match[1], name=match[1]).down()


def check_machine() -> None:
    """Raise one sentence when this machine cannot run a virtual cluster (root, tools, namespaces)."""
    if os.geteuid() != 0:
        raise VClusterError("the virtual cluster needs root (network namespaces and slurmd run as root)")
    missing = [t for t in (*_SYSTEM_TOOLS, *_DAEMONS, "sinfo") if shutil.which(t) is None]
    if missing:
        raise VClusterError(f"the virtual cluster needs {', '.join(missing)} on PATH; `make setup` as root installs "
                            "Slurm (slurmctld slurmd slurm-client) and iproute2/util-linux are in every Debian")
    refusal = namespace_refusal()
    if refusal is not None:
        raise VClusterError(f"this machine cannot create network namespaces (`ip netns add` said: "
                            f"{refusal}); the virtual cluster needs them")
