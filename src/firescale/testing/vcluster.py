"""A virtual multi-node Slurm cluster on one machine: each node a network namespace with its own address,
hostname and slurmd, the controller in another; started and stopped by firescale (root only).

Layout for a cluster named NAME with n nodes (every address lives only inside these namespaces):

    NAME-net : bridge br0 and one veth per host (nothing appears in the root namespace)
    NAME-ctl : eth0 10.77.0.10, hostname ctl, slurmctld
    NAME-nI  : eth0 10.77.0.(10+I), hostname nI, slurmd -N nI, pinned to real core (I-1) mod cores

Slurm's clients reach the controller only from inside a namespace: `DIR/enter ctl sbatch ...`, or the
client shims in `DIR/bin` (sbatch, squeue, sacct, scancel, scontrol, sinfo, srun) that do just that.
There is no sshd: `DIR/ssh-bin/ssh HOST CMD` runs CMD on HOST in a fresh login environment, for
launchers that insist on ssh (horovodrun, mpirun without Slurm integration).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from firescale.errors import FirescaleError

SUBNET = "10.77.0"
CONTROLLER_HOST = "ctl"
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun", "salloc")
_DAEMONS = ("slurmctld", "slurmd")
_SYSTEM_TOOLS = ("ip", "nsenter", "unshare", "taskset")

_ENTER = """#!/bin/bash
# enter HOST CMD...: run CMD on virtual host HOST (its network namespace, hostname and /etc/hosts).
# nsenter, not `ip netns exec`: the latter remounts /sys, which hides /sys/fs/cgroup from slurmd.
set -e
host=$1; shift
[ -n "$host" ] && [ $# -gt 0 ] || {{ echo "usage: $0 HOST CMD..." >&2; exit 2; }}
case " {hosts} " in *" $host "*) ;; *) echo "vcluster {name}: unknown host '$host' (hosts: {hosts})" >&2; exit 2 ;; esac
cpus={cpus_case}
# a compute node owns one real core: its cpuset cgroup when there is one (what Slurm's cgroups and
# MPI's binding see), else the core as CPU affinity
if [ -n "$cpus" ] && [ -w "{cpusets}/$host/cgroup.procs" ]; then echo $$ > "{cpusets}/$host/cgroup.procs"; fi
export SLURM_CONF={conf}
exec nsenter --net=/run/netns/{name}-"$host" unshare --uts --mount --propagation private \\
  taskset -c "${{cpus:-0-{last}}}" sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \\
  vcluster {hosts_file} "$host" "$@"
"""

_CLIENT = """#!/bin/bash
# {client}, run on the controller's host of the virtual cluster {name}.
exec {enter} {ctl} {client} "$@"
"""

_SSH = """#!/bin/bash
# ssh HOST CMD for the virtual cluster {name}, which has no sshd.  Like a real ssh, CMD runs in a fresh
# login environment on HOST: nothing of the caller's environment crosses unless the launcher passes it
# on the command line (mpirun -x, horovodrun).  Options are skipped as ssh would read them (Horovod puts
# some after the host name).
host=
while [ $# -gt 0 ]; do
  case $1 in
    -[oplieFJWLRDbcm]) shift 2 ;;
    -*) shift ;;
    *) [ -n "$host" ] && break; host=${{1%%.*}}; shift ;;
  esac
done
exec {enter} "$host" env -i HOME="${{HOME:-/root}}" USER="$(id -un)" LOGNAME="$(id -un)" SHELL=/bin/bash \\
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "cd; $*"
"""


class VClusterError(FirescaleError):
    """The virtual cluster cannot be started or used here."""


@dataclass(frozen=True)
class VirtualCluster:
    """Files under `root`, namespaces `<name>-*`, `nodes` compute nodes n1..nN."""

    root: Path
    nodes: int = 2
    name: str = "fsvc"
    memory_mb: int = 2000

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 200:
            raise VClusterError(f"vcluster: {self.nodes} nodes asked for; choose 1 to 200")
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,19}", self.name):
            raise VClusterError(f"vcluster: name {self.name!r}: use up to 20 lowercase letters, digits or '-', "
                                "starting with a letter")

    # --- names
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

    @property
    def enter(self) -> Path:
        """The script that runs a command on one virtual host: `enter HOST CMD...`."""
        return self.root / "enter"

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def bin(self) -> Path:
        """Slurm client shims that run the real clients inside the controller's namespace."""
        return self.root / "bin"

    @property
    def ssh_bin(self) -> Path:
        """A folder holding only `ssh`: a stand-in for sshd-less hosts, for launchers that insist on ssh."""
        return self.root / "ssh-bin"

    @property
    def cpusets(self) -> Path:
        """The cluster's cpuset cgroup (v1 hierarchy), one child per node."""
        return CPUSET_ROOT / f"firescale-{self.name}"

    def core_of(self, node: str) -> int:
        """The real core a compute node owns (shared round-robin when nodes outnumber cores)."""
        return self.node_names.index(node) % (os.cpu_count() or 1)

    def client(self, *argv: str) -> list[str]:
        """argv that runs a Slurm client command on the controller's host."""
        return [str(self.enter), CONTROLLER_HOST, *argv]

    # --- state
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(self.namespace(h) for h in self.hosts)]

    def existing_namespaces(self) -> list[str]:
        """This cluster's namespaces that exist, also nodes beyond `nodes` (left by a larger bring-up)."""
        have = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        ours = re.compile(rf"{re.escape(self.name)}-(net|ctl|n[0-9]+)")
        return sorted((ns for ns in have if ours.fullmatch(ns)), key=_bridge_first)

    def _pidfile(self, daemon: str, host: str) -> Path:
        return self.root / ("slurmctld.pid" if daemon == "slurmctld" else f"slurmd-{host}.pid")

    def _daemon_pids(self) -> dict[str, int | None]:
        pids: dict[str, int | None] = {"ctl": _read_pid(self._pidfile("slurmctld", CONTROLLER_HOST))}
        pids.update({n: _read_pid(self._pidfile("slurmd", n)) for n in self.node_names})
        for extra in self.root.glob("slurmd-*.pid") if self.root.is_dir() else []:
            pids.setdefault(extra.stem.removeprefix("slurmd-"), _read_pid(extra))
        return pids

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it (empty when the controller does not answer)."""
        try:
            proc = subprocess.run(self.client("sinfo", "-h", "-N", "-o", "%N %T"), capture_output=True,
                                  text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return {}
        if proc.returncode:
            return {}
        return dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)

    def is_up(self) -> bool:
        if self.existing_namespaces() != sorted(self.namespaces(), key=_bridge_first):
            return False
        if any(pid is None for pid in self._daemon_pids().values()):
            return False
        states = self.node_states()
        return sorted(states) == sorted(self.node_names) and all(_usable(s) for s in states.values())

    # --- bring-up
    def up(self, timeout: float = 60) -> None:
        """Start the cluster; a no-op when it is already up, a clean restart when half up."""
        check_machine()
        if self.is_up():
            return
        self.down()
        self._write_files()
        try:
            self._make_cpusets()
            self._make_network()
            self._start_daemons()
            self._wait_idle(timeout)
        except BaseException:
            self.down()
            raise

    def _write_files(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ["state", "log", "jobs", "bin", "ssh-bin", *(f"spool/{n}" for n in self.node_names),
                    *(f"tmp/{n}" for n in self.node_names)]:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", *(f"{self.address(h)} {h}" for h in self.hosts)]
        _write(self.root / "hosts", "\n".join(lines) + "\n")
        _write(self.conf, slurm_conf(self))
        cores = os.cpu_count() or 1
        cpus_case = '$(case "$host" in ' + " ".join(
            f"{n}) echo {self.core_of(n)} ;;" for n in self.node_names) + " esac)"
        _write(self.enter, _ENTER.format(name=self.name, hosts=" ".join(self.hosts), cpus_case=cpus_case,
                                         cpusets=self.cpusets, last=cores - 1, conf=self.conf,
                                         hosts_file=self.root / "hosts"), mode=0o755)
        search = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                 if p and Path(p).resolve() != self.bin.resolve())
        for client in CLIENTS:  # the real program by its full path: the shims may come first on PATH
            real = shutil.which(client, path=search) or client
            _write(self.bin / client, _CLIENT.format(client=real, name=self.name, enter=self.enter,
                                                     ctl=CONTROLLER_HOST), mode=0o755)
        _write(self.ssh_bin / "ssh", _SSH.format(name=self.name, enter=self.enter), mode=0o755)

    def _make_cpusets(self) -> None:
        """One cpuset cgroup per node when the v1 cpuset hierarchy is writable; else `enter` uses affinity."""
        if not (CPUSET_ROOT / "cpuset.cpus").is_file() or not os.access(CPUSET_ROOT, os.W_OK):
            return
        mems = (CPUSET_ROOT / "cpuset.mems").read_text().strip()
        top = self.cpusets
        top.mkdir(exist_ok=True)
        (top / "cpuset.cpus").write_text((CPUSET_ROOT / "cpuset.cpus").read_text().strip())
        (top / "cpuset.mems").write_text(mems)
        for node in self.node_names:
            (top / node).mkdir(exist_ok=True)
            (top / node / "cpuset.cpus").write_text(str(self.core_of(node)))
            (top / node / "cpuset.mems").write_text(mems)

    def _remove_cpusets(self) -> None:
        nodes = [p for p in self.cpusets.iterdir() if p.is_dir()] if self.cpusets.is_dir() else []
        for folder in [*nodes, self.cpusets]:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def _make_network(self) -> None:
        net = self.bridge_namespace
        _ip("netns", "add", net)
        _ip("-n", net, "link", "add", "br0", "type", "bridge")
        _ip("-n", net, "link", "set", "br0", "up")
        _ip("-n", net, "link", "set", "lo", "up")
        for host in self.hosts:
            ns = self.namespace(host)
            _ip("netns", "add", ns)
            # the pair is made inside the bridge's namespace and its peer moved straight into ns:
            # no interface ever appears in the root namespace
            _ip("-n", net, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", net, "link", "set", f"v-{host}", "master", "br0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def _start_daemons(self) -> None:
        self._start(CONTROLLER_HOST, "slurmctld", "-i")
        for node in self.node_names:
            self._start(node, "slurmd", "-N", node)

    def restart_node(self, node: str, timeout: float = 60) -> None:
        """Start a node's slurmd again after it died, and wait until Slurm takes the node back."""
        self._start(node, "slurmd", "-N", node)
        self._wait_idle(timeout)

    def _start(self, host: str, daemon: str, *args: str) -> None:
        """Start a daemon on `host` (`enter` gives it the host's namespace and SLURM_CONF)."""
        proc = subprocess.run([str(self.enter), host, daemon, *args], capture_output=True, text=True, timeout=60)
        if proc.returncode:
            raise VClusterError(f"vcluster {self.name}: {daemon} on {host} did not start "
                                f"({(proc.stderr or proc.stdout).strip()}); see {self.root / 'log'}")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if sorted(states) == sorted(self.node_names) and all(_usable(s) for s in states.values()):
                return
            time.sleep(0.3)
        raise VClusterError(f"vcluster {self.name}: nodes not idle after {timeout:.0f} s ({states or 'no answer'}); "
                            f"see {self.root / 'log'}")

    # --- tear-down
    def down(self) -> None:
        """Stop every process in the cluster's namespaces and delete the namespaces; safe to repeat."""
        pids = [p for p in self._daemon_pids().values() if p]
        inside = processes_in(self.existing_namespaces())
        for pid in [*pids, *inside]:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in [*pids, *inside]):
            time.sleep(0.1)
        for pid in processes_in(self.existing_namespaces()):
            _signal(pid, signal.SIGKILL)
        for ns in reversed(self.existing_namespaces()):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for daemon_file in self.root.glob("*.pid") if self.root.is_dir() else []:
            daemon_file.unlink(missing_ok=True)
        self._remove_cpusets()
        leftover = self.existing_namespaces()
        if leftover:
            raise VClusterError(f"vcluster {self.name}: could not delete namespaces {', '.join(leftover)}")


def remove_abandoned_clusters(prefix: str, root: Path) -> None:
    """Tear down clusters named PREFIX<pid> whose process is gone (a test session killed before its
    tear-down); their files go under `root`."""
    for ns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        match = re.fullmatch(rf"({re.escape(prefix)}([0-9]+))-ctl", ns)
        if match and not os.path.exists(f"/proc/{match[2]}"):
            VirtualCluster(root=root / match[1], name=match[1]).down()


def slurm_conf(c: VirtualCluster) -> str:
    """slurm.conf of the virtual cluster: no munge, no accounting, one CPU (one real core) per node."""
    r = c.root
    nodes = "\n".join(f"NodeName={n} NodeAddr={c.address(n)} CPUs=1 RealMemory={c.memory_mb} State=UNKNOWN"
                      for n in c.node_names)
    return f"""# generated by firescale vcluster; re-run `firescale vcluster up` instead of editing
ClusterName={c.name}
SlurmctldHost={CONTROLLER_HOST}({c.address(CONTROLLER_HOST)})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
TmpFS={r}/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=10
# a node whose slurmd is gone is declared down (and its jobs NODE_FAIL) in seconds, not minutes
SlurmdTimeout=15
{nodes}
PartitionName=debug Nodes={','.join(c.node_names)} Default=YES MaxTime=INFINITE State=UP
"""


def check_machine() -> None:
    """Raise one sentence when this machine cannot run a virtual cluster (root, tools, namespaces)."""
    if os.geteuid() != 0:
        raise VClusterError("the virtual cluster needs root (network namespaces and slurmd run as root)")
    missing = [t for t in (*_SYSTEM_TOOLS, *_DAEMONS, "sinfo") if shutil.which(t) is None]
    if missing:
        raise VClusterError(f"the virtual cluster needs {', '.join(missing)} on PATH; `make setup` as root installs "
                            "Slurm (slurmctld slurmd slurm-client) and iproute2/util-linux are in every Debian")
    probe = f"fsprobe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode:
        raise VClusterError(f"this machine cannot create network namespaces (`ip netns add` said: "
                            f"{made.stderr.strip() or made.returncode}); the virtual cluster needs them")


def processes_in(namespaces: list[str]) -> list[int]:
    """Every process whose network namespace is one of `namespaces` (named under /run/netns)."""
    wanted = set()
    for ns in namespaces:
        try:
            st = os.stat(f"/run/netns/{ns}")
        except OSError:
            continue
        wanted.add((st.st_dev, st.st_ino))
    found = []
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in wanted:
            found.append(int(entry))
    return found


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise VClusterError(f"vcluster: `ip {' '.join(argv)}` failed: {proc.stderr.strip()}")


def _bridge_first(namespace: str) -> tuple[bool, str]:
    """Sort key: the bridge's namespace first (created first, deleted last), then by name."""
    return (not namespace.endswith("-net"), namespace)


def _usable(state: str) -> bool:
    return state.rstrip("*") in ("idle", "mixed", "allocated", "completing")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
