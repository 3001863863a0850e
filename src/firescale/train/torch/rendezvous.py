"""Where a rank stands (its launcher's variables) and where the ranks meet: a TCP store for torch.distributed."""
from __future__ import annotations

import atexit
import ipaddress
import itertools
import re
import shutil
import socket
import subprocess
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from firescale.errors import FirescaleError

# Launchers whose ranks are MPI processes: their rank 0 hands the rendezvous to the others through MPI.
MPI_LAUNCHERS = frozenset({"openmpi", "mpich", "aprun"})

# Without MPI and without MASTER_PORT, a Slurm step's ranks meet on a port derived from the job and step ids
# (slurm_port): below Linux's ephemeral range (32768-60999), so no client socket holds it.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000
SLURM_STEP_STRIDE = 1009   # steps of one job running at once start on ports this far apart


@dataclass(frozen=True)
class Place:
    """This process's place among a job's ranks, as its launcher's environment gives it.

    `local_rank` and `local_size` are None where an MPI launcher does not give them (aprun; Hydra without
    MPI_LOCALNRANKS): MPI tells them then (local_of_mpi).
    """

    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    launcher: str    # openmpi, mpich, aprun, slurm, torchrun, or none (one process on its own)

    @property
    def mpi(self) -> bool:
        """Whether the launcher started MPI processes (which can meet through MPI_COMM_WORLD)."""
        return self.launcher in MPI_LAUNCHERS


def _whole(env: Mapping[str, str], name: str, *, least: int, below: tuple[str, int] | None = None) -> int:
    """The whole number in variable `name`: at least `least` and, with `below` (what bounds it, the bound), under it."""
    text = env.get(name, "").strip()
    value = int(text) if re.fullmatch(r"\d+", text) else -1
    if value < least or (below is not None and value >= below[1]):
        allowed = (f"a whole number from {least} to {below[1] - 1} ({below[0]})" if below
                   else f"a whole number of at least {least}")
        shown = f"is {env[name]!r}" if name in env else "is unset"
        raise FirescaleError(f"the launcher's variable {name} {shown}, but it must be {allowed}")
    return value


def _place(env: Mapping[str, str], launcher: str, rank: str, size: str, local_rank: str | None = None,
           local_size: str | None = None) -> Place:
    """The Place the named variables give; the local ones may be left out."""
    n = _whole(env, size, least=1)
    r = _whole(env, rank, least=0, below=(f"under {size}={n}", n))
    if local_rank is None or local_size is None:
        return Place(r, n, None, None, launcher)
    ln = _whole(env, local_size, least=1, below=(f"at most {size}={n}", n + 1))
    return Place(r, n, _whole(env, local_rank, least=0, below=(f"under {local_size}={ln}", ln)), ln, launcher)


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed task counts per node (SLURM_TASKS_PER_NODE's `2(x3),1`) as one count per node."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(part)
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _slurm_place(env: Mapping[str, str]) -> Place:
    """A task of an srun step: SLURM_PROCID of SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID of its
    node's count in SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE), the node
    being SLURM_NODEID."""
    size = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") if v in env), None)
    per_node = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
                     if v in env), None)
    if size is None or per_node is None or "SLURM_LOCALID" not in env:
        raise FirescaleError("a task of an srun step needs SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), "
                             "SLURM_LOCALID and SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE), and one is unset")
    place = _place(env, "slurm", "SLURM_PROCID", size)
    try:
        counts = expand_counts(env[per_node])
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise FirescaleError(f"the launcher's variable {per_node} is {env[per_node]!r}, but it must be Slurm's task "
                             "counts per node, such as 4 or 2(x3),1")
    node = 0
    if len(counts) > 1:
        if "SLURM_NODEID" not in env:
            raise FirescaleError(f"SLURM_NODEID is unset, but {per_node}={env[per_node]} names {len(counts)} nodes; "
                                 "it must say which of them this task runs on")
        node = _whole(env, "SLURM_NODEID", least=0, below=(f"one of the {len(counts)} nodes of {per_node}",
                                                           len(counts)))
    here = counts[node]
    if here > place.size:
        raise FirescaleError(f"the launcher's variable {per_node} is {env[per_node]!r}, but a node's count must be "
                             f"at most {size}={place.size}")
    local = _whole(env, "SLURM_LOCALID", least=0, below=(f"under this node's {here} tasks in {per_node}", here))
    return Place(place.rank, place.size, local, here, "slurm")


def launcher_place(env: Mapping[str, str]) -> Place:
    """This process's rank, the job's size and its node's share, from the variables its launcher set.

    The innermost launcher wins: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) started under srun or
    mpirun; then Open MPI's mpirun (OMPI_COMM_WORLD_*), whose ranks inside a Slurm job still carry the batch
    script's SLURM_* variables; MPICH's Hydra and Cray MPICH (PMI_RANK or ALPS_APP_PE under aprun, PMI_SIZE,
    MPI_LOCALRANKID, MPI_LOCALNRANKS); a task of an srun step (SLURM_STEP_ID set: without it SLURM_PROCID is
    the batch script's, and the process runs on its own, as Open MPI then starts a singleton).  None of them:
    one rank.  A value that is not a whole number, or a rank not under its size, is a FirescaleError.
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        if "LOCAL_RANK" not in env or "LOCAL_WORLD_SIZE" not in env:
            raise FirescaleError("RANK and WORLD_SIZE are set but LOCAL_RANK or LOCAL_WORLD_SIZE is not; torchrun sets "
                                 "all four, and ranks started otherwise need them too")
        return _place(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "OMPI_COMM_WORLD_RANK" in env:
        return _place(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE")
    rank = next((v for v in ("PMI_RANK", "ALPS_APP_PE") if v in env), None)
    if rank is not None:
        if "PMI_SIZE" not in env:
            raise FirescaleError(f"the launcher set {rank} but not PMI_SIZE; an MPICH or Cray MPICH rank needs both")
        local = ("MPI_LOCALRANKID", "MPI_LOCALNRANKS") if "MPI_LOCALNRANKS" in env else (None, None)
        return _place(env, "aprun" if "ALPS_APP_PE" in env else "mpich", rank, "PMI_SIZE", *local)
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return _slurm_place(env)
    return Place(0, 1, 0, 1, "none")


# --- the rendezvous -------------------------------------------------------------------------------------------


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list (`n[1-3],m5`, `gpu[01-02]-ib`, `r[1-2]n[1-2]`) as host names, in order."""
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for piece in pieces:
            if not (piece.startswith("[") and piece.endswith("]")):
                choices.append([piece])
                continue
            names = []
            for span in piece[1:-1].split(","):
                first, _, last = span.partition("-")
                if not last:
                    names.append(first)
                    continue
                width = len(first)
                names += [str(i).zfill(width) for i in range(int(first), int(last) + 1)]
            choices.append(names)
        hosts += ["".join(parts) for parts in itertools.product(*choices)]
    return hosts


def first_host(nodelist: str, run: Callable[..., Any] = subprocess.run) -> str:
    """The first host of a Slurm node list, by `scontrol show hostnames` where it is installed, else parsed here."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            out = run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
            names = out.stdout.split() if out.returncode == 0 else []
            if names:
                return names[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = expand_nodelist(nodelist)
    if not hosts:
        raise FirescaleError(f"the Slurm node list {nodelist!r} names no host; set MASTER_ADDR to rank 0's host")
    return hosts[0]


def slurm_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of a Slurm step whose ranks have no MPI: SLURM_PORT_BASE plus the job id, and
    SLURM_STEP_STRIDE per step id, modulo SLURM_PORT_SPAN.  Two jobs whose first nodes are one meet on one port
    only when their ids differ by a multiple of the span; MASTER_PORT chooses another."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    number = int(job) if job.isdigit() else zlib.crc32(job.encode())
    return SLURM_PORT_BASE + (number + SLURM_STEP_STRIDE * (int(step) if step.isdigit() else 0)) % SLURM_PORT_SPAN


def reachable_address() -> str:
    """An IPv4 address of this host that other hosts reach: the host name's, unless that is a loopback
    address (Debian's 127.0.1.1), then that of the interface the default route leaves by; else the name."""
    name = socket.gethostname()
    candidates: list[str] = []
    try:
        candidates += [str(info[4][0]) for info in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))   # TEST-NET-1: a UDP connect picks a route and sends nothing
            candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    return next((a for a in candidates if not ipaddress.ip_address(a).is_loopback), name)


def _user_port(env: Mapping[str, str]) -> int | None:
    if "MASTER_PORT" not in env:
        return None
    text = env["MASTER_PORT"].strip()
    if not (text.isdigit() and 1 <= int(text) <= 65535):
        raise FirescaleError(f"MASTER_PORT is {env['MASTER_PORT']!r}, but it must be a TCP port from 1 to 65535")
    return int(text)


def mpi_world() -> Any:
    """MPI_COMM_WORLD through mpi4py, MPI initialised here if nobody has (and then finalised at exit)."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:   # initialised and finalised explicitly below, whoever imports it next
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init_thread()
        atexit.register(_finalize_mpi)
    return MPI.COMM_WORLD


_ABANDONED: list[bool] = []   # set once a peer is lost: MPI is then left without MPI_Finalize


def abandon_mpi() -> None:
    """A peer stopped or is gone (a collective gave up): this rank exits without MPI_Finalize, which would wait
    for that peer for ever (Open MPI's finalize meets every rank); the launcher then ends the others."""
    _ABANDONED.append(True)


def _finalize_mpi() -> None:
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and not _ABANDONED:
        MPI.Finalize()


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _listen(host: str, port: int, size: int, timeout: timedelta) -> Any:
    """Rank 0's store, listening on `port` of every interface (0: one the kernel picks, free by definition)."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port, size, is_master=True, timeout=timeout, wait_for_workers=False)
    except RuntimeError as e:
        raise FirescaleError(f"rank 0 cannot listen on TCP port {port} for the ranks' rendezvous ({_first_line(e)}); "
                             "set MASTER_PORT to a free port") from None


def _connect(host: str, port: int, size: int, timeout: timedelta) -> Any:
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    except RuntimeError as e:
        raise FirescaleError(f"this rank cannot reach rank 0's rendezvous at {host}:{port} within "
                             f"{timeout.total_seconds():g} s ({_first_line(e)}); set MASTER_ADDR and MASTER_PORT "
                             "to rank 0's host and a free port") from None


def _mpi_rendezvous(place: Place, env: Mapping[str, str], port: int | None, timeout: timedelta) -> tuple[Any, str, int]:
    """Rank 0 listens and tells the others where through MPI_COMM_WORLD; a failure there is every rank's."""
    world = mpi_world()
    store = None
    found: tuple[str, int] | str = ""
    if place.rank == 0:
        host = env.get("MASTER_ADDR") or ("127.0.0.1" if place.local_size == place.size else reachable_address())
        try:
            store = _listen(host, port or 0, place.size, timeout)
            found = (host, store.port)
        except FirescaleError as e:
            found = str(e)
    found = world.bcast(found, root=0)
    if isinstance(found, str):   # rank 0 could not listen: every rank says why, rather than waiting for it
        raise FirescaleError(found)
    host, port = found
    return store or _connect(host, port, place.size, timeout), host, port


def rendezvous(place: Place, env: Mapping[str, str], timeout: timedelta) -> tuple[Any, str, int]:
    """The store that the `place.size` > 1 ranks share, its host and its port; never a fixed port.

    MPI ranks: rank 0 listens on a port the kernel picks (port 0) of an address other hosts reach (the loopback
    when all ranks share its node) and broadcasts both through MPI_COMM_WORLD.  A Slurm step without MPI: the
    first host of its node list and slurm_port().  MASTER_ADDR and MASTER_PORT, where set, win.  torchrun's
    ranks meet as torch's env:// does (its agent may hold the store already).
    """
    import torch.distributed as dist

    port = _user_port(env)
    if place.launcher == "torchrun":
        store, _, _ = next(dist.rendezvous("env://", rank=place.rank, world_size=place.size, timeout=timeout))
        return store, env.get("MASTER_ADDR", ""), port or 0
    if place.mpi:
        return _mpi_rendezvous(place, env, port, timeout)
    if "MASTER_ADDR" in env:
        host = env["MASTER_ADDR"]
    else:
        nodelist = next((env[v] for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if v in env),
                        None)
        if nodelist is None:
            raise FirescaleError(f"the {place.launcher} ranks have neither MPI nor a Slurm node list to meet through; "
                                 "set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port")
        host = first_host(nodelist)
        node = env.get("SLURMD_NODENAME")
        if place.rank == 0 and node and node != host:
            raise FirescaleError(f"rank 0 runs on {node}, not on {host}, the first node of the step's node list; "
                                 "set MASTER_ADDR to rank 0's host")
    port = port if port is not None else slurm_port(env)
    if place.rank == 0:
        return _listen(host, port, place.size, timeout), host, port
    return _connect(host, port, place.size, timeout), host, port


def mpi_started(place: Place, env: Mapping[str, str]) -> bool:
    """Whether MPI started this job's ranks: an MPI launcher (mpirun, Hydra, aprun), or an srun step whose MPI
    plugin is PMIx (srun --mpi=pmix sets PMIX_RANK; --mpi=pmi2 sets PMI_RANK, read as MPICH's above)."""
    return place.mpi or (place.launcher == "slurm" and "PMIX_RANK" in env)


def local_of_mpi(place: Place) -> Place:
    """`place` with its node's share from MPI (ranks that share memory with this one) where the launcher gave none."""
    if place.local_rank is not None:
        return place
    node = mpi_world().Split_type(_shared())
    return Place(place.rank, place.size, node.Get_rank(), node.Get_size(), place.launcher)


def _shared() -> int:
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED
