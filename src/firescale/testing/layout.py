"""The virtual cluster's names, addresses and files: what every step of bringing it up and down agrees on.

For a cluster named NAME with n nodes (every address lives only inside these namespaces):

    NAME-net : bridge br0 and one veth per host (nothing appears in the root namespace)
    NAME-ctl : eth0 10.77.0.10, hostname ctl, slurmctld
    NAME-nI  : eth0 10.77.0.(10+I), hostname nI, slurmd -N nI, pinned to real core (I-1) mod cores
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.testing.cpusets import CPUSET_ROOT

SUBNET = "10.77.0"
CONTROLLER_HOST = "ctl"
DEFAULT_ROOT = Path(".firescale-work") / "vcluster"   # `firescale vcluster --dir`'s default, as site/vcluster expects


class VClusterError(FirescaleError):
    """The virtual cluster cannot be started or used here."""


def bridge_first(namespace: str) -> tuple[bool, str]:
    """Sort key: the bridge's namespace first (created first, deleted last), then by name."""
    return (not namespace.endswith("-net"), namespace)


@dataclass(frozen=True)
class ClusterLayout:
    """Files under `root`, namespaces `<name>-*`, `nodes` compute nodes n1..nN of `memory_mb` each.

    Each node owns one real core; Slurm counts `cpus_per_node` CPUs on it, so that many one-CPU tasks (ranks)
    can run on a node at once, taking turns on its core (the way to try 2 nodes x 2 ranks on 2 cores).
    """

    root: Path
    nodes: int = 2
    name: str = "fsvc"
    memory_mb: int = 2000
    cpus_per_node: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 200:
            raise VClusterError(f"vcluster: {self.nodes} nodes asked for; choose 1 to 200")
        if not 1 <= self.cpus_per_node <= 64:
            raise VClusterError(f"vcluster: {self.cpus_per_node} CPUs a node asked for; choose 1 to 64")
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,19}", self.name):
            raise VClusterError(f"vcluster: name {self.name!r}: use up to 20 lowercase letters, digits or '-', "
                                "starting with a letter")

    # --- hosts and namespaces
    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def hosts(self) -> list[str]:
        return [CONTROLLER_HOST, *self.node_names]

    def address(self, host: str) -> str:
        return f"{SUBNET}.{10 + self.hosts.index(host)}"

    def namespace(self, host: str) -> str:
        return f"{self.name}-{host}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.name}-net"

    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(self.namespace(h) for h in self.hosts)]

    def is_own_namespace(self, namespace: str) -> bool:
        """Whether `namespace` is this cluster's, also a node beyond `nodes` (left by a larger bring-up)."""
        return re.fullmatch(rf"{re.escape(self.name)}-(net|ctl|n[0-9]+)", namespace) is not None

    def core_of(self, node: str) -> int:
        """The real core a compute node owns (shared round-robin when nodes outnumber cores)."""
        return self.node_names.index(node) % (os.cpu_count() or 1)

    # --- files
    @property
    def enter(self) -> Path:
        """The script that runs a command on one virtual host: `enter HOST CMD...`."""
        return self.root / "enter"

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def hosts_file(self) -> Path:
        """The /etc/hosts every virtual host sees."""
        return self.root / "hosts"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def bin(self) -> Path:
        """Slurm client shims that run the real clients inside the controller's namespace."""
        return self.root / "bin"

    @property
    def ssh_bin(self) -> Path:
        """A folder holding only `ssh`: a stand-in for sshd-less hosts, for launchers that insist on ssh."""
        return self.root / "ssh-bin"

    def pidfile(self, daemon: str, host: str) -> Path:
        """Where slurm.conf has `daemon` on `host` write its pid."""
        return self.root / ("slurmctld.pid" if daemon == "slurmctld" else f"slurmd-{host}.pid")

    @property
    def cpusets(self) -> Path:
        """The cluster's cpuset cgroup (v1 hierarchy), one child per node."""
        return CPUSET_ROOT / f"firescale-{self.name}"

    def client(self, *argv: str) -> list[str]:
        """argv that runs a Slurm client command on the controller's host."""
        return [str(self.enter), CONTROLLER_HOST, *argv]
