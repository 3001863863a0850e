"""torch.distributed set-up for one rank: its device and core, the process group, sums, and the allreduce in use."""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from firescale.cluster.collectives import decode_allreduce
from firescale.errors import FirescaleError
from firescale.train.host import pin_cpus
from firescale.train.torch.rendezvous import Place, launcher_place, local_of_mpi, rendezvous

PROCESS_GROUPS = ("auto", "gloo", "nccl")
RENDEZVOUS_TIMEOUT_S = 600.0   # how long ranks wait for each other at start and in a collective
# DistributedDataParallel's bucket_cap_mb default: gradients are summed in buckets of about this many bytes.
DDP_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass
class Rank:
    """This process's place in the job and its handle on the process group's collectives (none with one rank)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str                    # cpu, or cuda:N
    pinned_cpus: list[int]
    process_group: str             # gloo, nccl, or none (one rank)
    devices: tuple[str, ...] = ()  # the Horovod Rank's devices of a net split by layers: never, here
    rendezvous: str = ""           # host:port where the ranks met ("" with one rank)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def sum(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Element-wise sums over all ranks of each tensor: one flat buffer per dtype, each all_reduce(SUM) started
        before any is waited for, split back into new tensors of the inputs' shapes."""
        if self.size == 1:
            return list(tensors)
        return _flat_sum(list(tensors))

    def sum_numbers(self, values: Sequence[float]) -> np.ndarray:
        """Sums over all ranks of a few float64 numbers (exact for counts)."""
        array = np.array(values, dtype=np.float64)
        if self.size == 1:
            return array
        t = torch.from_numpy(array).to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().numpy()

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(device_ids=[torch.device(self.device).index] if self.process_group == "nccl" else None)

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's values into every rank's `tensors`, in place (one broadcast per dtype)."""
        if self.size == 1 or not tensors:
            return
        with torch.no_grad():
            for members in _by_dtype(tensors):
                flat = torch.cat([tensors[i].detach().reshape(-1) for i in members])
                dist.broadcast(flat, src=0)
                if not self.is_root:
                    for i, piece in zip(members, flat.split([tensors[i].numel() for i in members])):
                        tensors[i].copy_(piece.view_as(tensors[i]))

    def broadcast_object(self, obj: Any) -> Any:
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Destroy the process group (a one-rank run has none)."""
        if self.process_group != "none" and dist.is_initialized():
            dist.destroy_process_group()


def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """The indices of `tensors` grouped by dtype and device, groups and members in the order they come."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return list(groups.values())


def _flat_sum(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    started = []
    for members in _by_dtype(tensors):
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in members])
        started.append((members, flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)))
    out: list[torch.Tensor] = list(tensors)
    for members, flat, work in started:
        work.wait()
        for i, piece in zip(members, flat.split([tensors[i].numel() for i in members])):
            out[i] = piece.view_as(tensors[i])
    return out


def _gpu(place: Place) -> torch.device:
    """This rank's GPU: its local rank's, or the one GPU its launcher left it (CUDA_VISIBLE_DEVICES)."""
    count = torch.cuda.device_count()
    index = 0 if count == 1 else place.local_rank or 0
    if index >= count:
        raise FirescaleError(f"local rank {index} needs GPU {index}, but this node shows {count} GPUs; start at most "
                             f"{count} ranks per node, one GPU each")
    return torch.device("cuda", index)


def init_rank(threads: int = 1, devices: int = 1, *, process_group: str = "auto",
              timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> Rank:
    """This rank's place from its launcher, one device (the local rank's GPU, else one pinned core), `threads`
    torch threads, cuDNN's deterministic kernels, and, with several ranks, the process group: NCCL on GPUs and Gloo on
    CPUs unless `process_group` names one.  One rank creates no process group: there is nothing to sum."""
    if devices != 1:
        raise FirescaleError(f"devices is {devices}, but the PyTorch backend runs one device per rank; a net split "
                             "over devices needs the TensorFlow backend")
    if process_group not in PROCESS_GROUPS:
        raise FirescaleError(f"process group {process_group!r} is not known; known: {', '.join(PROCESS_GROUPS)}")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if process_group == "nccl" and not cuda:
        raise FirescaleError("NCCL needs a CUDA GPU on every rank, and this node has none; use gloo or a GPU site")
    place = launcher_place(os.environ)
    if place.size > 1 and place.mpi:
        place = local_of_mpi(place)
    local_rank, local_size = place.local_rank or 0, place.local_size or 1
    backend = "nccl" if cuda and process_group != "gloo" else "gloo"
    device = _gpu(place) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # cuDNN's deterministic kernels, chosen by rule rather than by timing.  torch.use_deterministic_algorithms
        # is the trainer's to call: it imports torch._inductor, seconds of each rank's start.
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.set_num_threads(threads)
    met = ""
    if place.size > 1:
        timeout = timedelta(seconds=timeout_s)
        store, host, port = rendezvous(place, os.environ, timeout)
        met = f"{host}:{port}"
        dist.init_process_group(backend, store=store, rank=place.rank, world_size=place.size, timeout=timeout,
                                device_id=device if backend == "nccl" else None)
    # Pinned last, so that the threads the process group and MPI started keep to the rank's core too.
    pinned = [] if cuda else pin_cpus(local_rank, local_size)
    return Rank(place.rank, place.size, local_rank, local_size, str(device), pinned,
                backend if place.size > 1 else "none", rendezvous=met)


class GradientBuckets:
    """Gradients summed over the ranks while backward still runs, as DistributedDataParallel sums them.

    `parameters` (those that require a gradient, in the order the forward uses them) are grouped into buckets of
    about `bucket_bytes` (DDP's default 25 MiB; one parameter larger than that is a bucket of its own), last
    parameter first: backward produces their gradients in about that order.  A hook on each parameter, run once
    its gradient is accumulated, counts down its bucket; a full bucket is copied into one flat buffer and its
    all_reduce(SUM) started, buckets always in the same order on every rank (a full bucket waits for the ones
    before it).  `wait()` after backward starts what is left (a parameter with no gradient counts as zeros),
    waits, and returns the sums aligned with `parameters`.  One backward per wait(); one rank sums nothing.
    """

    def __init__(self, rank: Rank, parameters: Iterable[torch.Tensor], bucket_bytes: int = DDP_BUCKET_BYTES):
        if bucket_bytes < 1:
            raise FirescaleError(f"bucket_bytes is {bucket_bytes}, but a gradient bucket must hold at least one byte")
        self.rank = rank
        self.bucket_bytes = int(bucket_bytes)
        self.parameters = list({id(p): p for p in parameters if p.requires_grad}.values())
        self.buckets = plan_buckets(self.parameters, self.bucket_bytes)
        self._bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self._handles = []
        if rank.size > 1:
            self._handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.parameters)]
        self._reset()

    def _reset(self) -> None:
        self._waiting = [len(members) for members in self.buckets]
        self._started: list[tuple[torch.Tensor, Any]] = []

    def _hook(self, i: int) -> Any:
        def ready(_: torch.Tensor) -> None:
            b = self._bucket_of[i]
            self._waiting[b] -= 1
            if self._waiting[b] < 0:
                raise FirescaleError("a second backward reached a gradient bucket before wait(); call wait() after "
                                     "each backward")
            while len(self._started) < len(self.buckets) and self._waiting[len(self._started)] == 0:
                self._start(len(self._started))
        return ready

    def _gradient(self, i: int) -> torch.Tensor:
        p = self.parameters[i]
        return p.grad if p.grad is not None else torch.zeros_like(p)

    def _start(self, b: int) -> None:
        with torch.no_grad():
            flat = torch.cat([self._gradient(i).detach().reshape(-1) for i in self.buckets[b]])
        self._started.append((flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)))

    def wait(self) -> list[torch.Tensor]:
        """The gradients summed over all ranks, one per parameter; ready for the next backward."""
        if self.rank.size == 1:
            return [self._gradient(i) for i in range(len(self.parameters))]
        while len(self._started) < len(self.buckets):   # buckets some of whose gradients never came
            self._start(len(self._started))
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.parameters)
        for members, (flat, work) in zip(self.buckets, self._started):
            work.wait()
            for i, piece in zip(members, flat.split([self.parameters[i].numel() for i in members])):
                out[i] = piece.view_as(self.parameters[i])
        self._reset()
        return out

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def plan_buckets(parameters: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of `parameters` in buckets, last parameter first; a bucket holds one dtype on one device and
    closes before it would pass `bucket_bytes`."""
    buckets: list[list[int]] = []
    filled, kind = 0, None
    for i in reversed(range(len(parameters))):
        p = parameters[i]
        size = p.numel() * p.element_size()
        if not buckets or (p.dtype, p.device) != kind or filled + size > bucket_bytes:
            buckets.append([])
            filled, kind = 0, (p.dtype, p.device)
        buckets[-1].append(i)
        filled += size
    return buckets


def summed_gradients(rank: Rank, parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The grouped sum after backward: every parameter's gradient (zeros where it has none) in one Rank.sum."""
    return rank.sum([p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters])


def describe_allreduce(rank: Rank, env: Mapping[str, str] | None = None, *, gradient_bytes: int | None = None,
                       overlap: bool = False, bucket_bytes: int | None = None) -> dict[str, Any]:
    """Which allreduce summed the gradients: what the job asked for (FIRESCALE_ALLREDUCE), the library that carried
    them (the process group's NCCL or Gloo), the algorithm its settings select, decoded by the same vocabulary that
    set them (firescale.cluster.collectives), with its cost model; and whether buckets of `bucket_bytes` overlapped
    the backward pass (`overlap`) or one grouped sum of `gradient_bytes` followed it."""
    env = dict(os.environ if env is None else env)
    library = rank.process_group if rank.size > 1 else "none"
    buckets = int(bucket_bytes or DDP_BUCKET_BYTES) if overlap else None
    message = None
    if gradient_bytes is not None:
        message = min(int(gradient_bytes), buckets) if buckets else int(gradient_bytes)
    # Gloo's allreduce of CPU tensors is its ring (gloo/allreduce.cc runs `ring` unless BCUBE is asked for, and
    # ProcessGroupGloo asks for nothing), whatever FIRESCALE_ALLREDUCE requested: decode_allreduce says "gloo ring".
    # NCCL follows NCCL_ALGO, which a GPU site's job exports for its allreduce.algorithm.
    used = decode_allreduce(env, ranks=rank.size, library=library if library != "none" else "gloo",
                            message_bytes=message)
    return {
        "requested": env.get("FIRESCALE_ALLREDUCE", "default"),
        "controller": "torch.distributed",
        "cpu_operations": "gloo" if library == "gloo" else "none",   # under NCCL, CPU numbers go to the GPU first
        "device": rank.device,
        "ompi_coll_tuned": {k[len("OMPI_MCA_"):]: v for k, v in sorted(env.items())
                            if k.startswith("OMPI_MCA_coll_tuned_")},
        "nccl_algo": env.get("NCCL_ALGO"),
        "horovod_knobs": {},
        "ranks": rank.size,
        "library": used.library,
        "message_bytes": message,
        "algorithm": used.algorithm,
        "model": used.model,
        "tree": used.tree,
        "overlap": bool(overlap),
        "collectives": collectives_record(rank),
        "process_group": rank.process_group,
        "bucket_bytes": buckets,
    }


def collectives_record(rank: Rank) -> dict[str, Any]:
    """For the run record: the library that summed the gradients and which backends this torch was built with."""
    library = {"nccl": "NCCL", "gloo": "Gloo"}.get(rank.process_group, "none")
    return {"library": library, "gpu_operations": library if library == "NCCL" else None,
            "gloo_available": dist.is_gloo_available(), "nccl_available": dist.is_nccl_available(),
            "mpi_available": dist.is_mpi_available()}


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()   # (major, minor, patch); an int in old releases
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def versions(rank: Rank) -> dict[str, str | None]:
    """Versions of the stack that produced a result (None: not in this build, or not on this node)."""
    from firescale import __version__

    cuda = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version()
    out: dict[str, str | None] = {
        "firescale": __version__, "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None if cudnn is None else str(cudnn),
        "nccl": _nccl_version() if cuda and dist.is_nccl_available() else None,
        "process_group": rank.process_group,
    }
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
            out["mpi"] = text.strip().splitlines()[0] if text.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            out["mpi"] = "unknown"
    else:
        out["mpi"] = None
    out["hostname"] = socket.gethostname()
    return out
