"""torch.distributed set-up for one rank: its device and core, the process group, sums, and the allreduce in use."""
from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

import numpy as np
import torch
import torch.distributed as dist

from firescale.cluster.collectives import resolve_process_group
from firescale.cluster.timeouts import COLLECTIVE_TIMEOUT_VARIABLE, DEFAULT_COLLECTIVE_TIMEOUT_S
from firescale.errors import FirescaleError
from firescale.frameworks import PYTORCH
from firescale.train.backend import CollectiveGaveUp
from firescale.train.host import mpi_implementation, pin_cpus
from firescale.train.ranks import ProcessGroupAllreduce, RankBasics, allreduce_settings, stack_versions
from firescale.train.torch import mpi_group
from firescale.train.torch.rendezvous import Place, abandon_mpi, launcher_place, local_of_mpi, mpi_started, rendezvous

RENDEZVOUS_TIMEOUT_S = 600.0   # how long ranks wait for each other at start
LIBRARY_NAMES = {"nccl": "NCCL", "gloo": "Gloo", "mpi": "MPI"}   # the run record's names of the process groups
T = TypeVar("T")


def default_bucket_bytes() -> int:
    """The overlapped allreduce's bucket unless a site sets one: the registry's (DistributedDataParallel's own
    bucket_cap_mb default)."""
    assert PYTORCH.overlap_bucket_mb is not None
    return int(PYTORCH.overlap_bucket_mb * 2**20)


class _Done:
    """A sum already done (MPI's blocking allreduce), waited for as torch.distributed's started ones are."""

    def wait(self) -> None:
        return None


DONE = _Done()


@dataclass
class Rank(RankBasics):
    """A torch.distributed rank (train/ranks.py): its collectives of several ranks are its process group's (none
    with one rank).

    `comm` is the MPI process group's communicator (train/torch/mpi_group.py); the other groups are
    torch.distributed's.  Its `devices` (a net split by layers) are never set: the backend runs one device a rank."""

    process_group: str             # gloo, mpi, nccl, or none (one rank)
    rendezvous: str = ""           # host:port where the ranks met ("" with one rank or the MPI group)
    comm: Any = None               # the MPI group's communicator (None for the others)
    timeout_s: float = 0.0         # how long the process group's collectives wait for a peer (0: no group)

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """A torch.distributed collective `what` (all_reduce, broadcast, ...) in the block: its library's error (the
        process group's timeout, or a peer's connection gone) becomes CollectiveGaveUp, one sentence naming it."""
        try:
            yield
        except RuntimeError as exc:   # torch.distributed's DistError and its kin derive from it
            library = LIBRARY_NAMES.get(self.process_group, self.process_group)
            words = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            abandon_mpi()   # MPI_Finalize at exit would wait for the lost peer
            raise CollectiveGaveUp(
                f"{what} ({library})",
                f"the {what} of rank {self.rank} over {self.size} ranks ({library}) gave up: {words}; a peer stopped, "
                f"hangs or is gone (the process group waits {self.timeout_s:g} s for a peer: the site's "
                "collective_timeout.seconds)") from None

    def start_sum(self, flat: torch.Tensor) -> Any:
        """all_reduce(SUM) of one flat buffer, in place, started; wait() on what it returns.  The MPI group's is
        MPI's blocking allreduce (mpi_group.py says why), done by the time it returns."""
        if self.comm is not None:
            mpi_group.sum_in_place(self.comm, flat)
            return DONE
        with self.collective("all_reduce"):
            return dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)

    def wait(self, work: Any) -> None:
        """Wait for a started sum (start_sum's)."""
        with self.collective("all_reduce"):
            work.wait()

    def _sum(self, tensors: list[Any]) -> list[Any]:
        """Element-wise sums over all ranks of each tensor: one flat buffer per dtype, each all_reduce(SUM) started
        before any is waited for, split back into new tensors of the inputs' shapes."""
        return _flat_sum(self, tensors)

    def _sum_numbers(self, array: np.ndarray) -> np.ndarray:
        if self.comm is not None:
            mpi_group.sum_in_place(self.comm, torch.from_numpy(array))   # the array's own memory
            return array
        t = torch.from_numpy(array).to(self.device)
        with self.collective("all_reduce"):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().numpy()

    def _barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()
        else:
            with self.collective("barrier"):
                dist.barrier(device_ids=[torch.device(self.device).index] if self.process_group == "nccl" else None)

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's values into every rank's `tensors`, in place (one broadcast per dtype)."""
        if self.size == 1 or not tensors:
            return
        with torch.no_grad():
            for members in _by_dtype(tensors):
                flat = torch.cat([tensors[i].detach().reshape(-1) for i in members])
                if self.comm is not None:
                    mpi_group.broadcast_in_place(self.comm, flat)
                else:
                    with self.collective("broadcast"):
                        dist.broadcast(flat, src=0)
                if not self.is_root:
                    for i, piece in zip(members, flat.split([tensors[i].numel() for i in members])):
                        tensors[i].copy_(piece.view_as(tensors[i]))

    def _broadcast_object(self, obj: T) -> T:
        if self.comm is not None:
            return cast(T, self.comm.bcast(obj, root=0))
        box = [obj]
        with self.collective("broadcast_object_list"):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def _gather_object(self, obj: T) -> list[T]:
        if self.comm is not None:
            return list(self.comm.allgather(obj))
        out: list[Any] = [None] * self.size
        with self.collective("all_gather_object"):
            dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Destroy the process group (a one-rank run has none); MPI itself stays up for whoever else uses it."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
        elif self.process_group != "none" and dist.is_initialized():
            dist.destroy_process_group()


def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """The indices of `tensors` grouped by dtype and device, groups and members in the order they come."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return list(groups.values())


def _flat_sum(rank: Rank, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    started = []
    for members in _by_dtype(tensors):
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in members])
        started.append((members, flat, rank.start_sum(flat)))
    out: list[torch.Tensor] = list(tensors)
    for members, flat, work in started:
        rank.wait(work)
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


def choose_process_group(requested: str, cuda: bool, place: Place, env: Mapping[str, str]) -> str:
    """The process group of ranks at `place` on GPUs (`cuda`) or CPUs: `requested` resolved as
    cluster.collectives.resolve_process_group does, where MPI started the ranks when an MPI launcher did (or a Slurm
    step through PMIx) and mpi4py imports; auto takes Gloo after all where MPI's world is not the launcher's job.
    A group the node cannot run is one sentence."""
    if requested not in PYTORCH.process_groups:
        raise FirescaleError(f"process group {requested!r} is not known; known: {', '.join(PYTORCH.process_groups)}")
    if requested == "nccl" and not cuda:
        raise FirescaleError("NCCL needs a CUDA GPU on every rank, and this node has none; use mpi or gloo, or a GPU "
                             "site")
    if requested == "mpi" and cuda:
        raise FirescaleError("the MPI process group sums CPU tensors, and this rank trains on a GPU; use nccl (or "
                             "auto) on GPUs")
    started = place.size > 1 and mpi_started(place, env) and importlib.util.find_spec("mpi4py") is not None
    group = resolve_process_group(requested, gpu=cuda, mpi_ranks=started)
    if requested == "auto" and group == "mpi" and not mpi_group.same_world(place):
        return "gloo"
    return group


def collective_timeout(env: Mapping[str, str]) -> float:
    """Seconds a collective waits for a peer: what the job exports from the site (FIRESCALE_COLLECTIVE_TIMEOUT_S),
    else the site schema's default."""
    text = env.get(COLLECTIVE_TIMEOUT_VARIABLE, "")
    try:
        value = float(text) if text else DEFAULT_COLLECTIVE_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FirescaleError(f"{COLLECTIVE_TIMEOUT_VARIABLE} is {text!r}; it must be a number of seconds > 0 (the "
                             "site's collective_timeout.seconds)")
    return value


def _all_arrive(store: Any, place: Place, timeout_s: float) -> None:
    """Every rank at the store, within the rendezvous's `timeout_s`: the process group then forms within its
    collectives' timeout, which may be much shorter than ranks take to start on a busy cluster."""
    store.set(f"firescale/arrived/{place.rank}", "1")
    try:
        store.wait([f"firescale/arrived/{r}" for r in range(place.size)], timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise FirescaleError(f"rank {place.rank}: not every one of the {place.size} ranks reached the rendezvous "
                             f"within {timeout_s:g} s ({(str(exc).strip().splitlines() or ['timeout'])[0]})") from None


def init_rank(threads: int = 1, devices: int = 1, *, process_group: str = "auto",
              timeout_s: float = RENDEZVOUS_TIMEOUT_S, collective_timeout_s: float | None = None) -> Rank:
    """This rank's place from its launcher, one device (the local rank's GPU, else one pinned core), `threads`
    torch threads, cuDNN's deterministic kernels, and, with several ranks, the process group `process_group`
    (choose_process_group: auto is NCCL on GPUs; on CPUs MPI for ranks MPI started, else Gloo).  The MPI group is
    MPI's own communicator, with no torch.distributed group or rendezvous beside it.  One rank creates no process
    group: there is nothing to sum.  The ranks meet within `timeout_s`; a collective of Gloo or NCCL then waits
    `collective_timeout_s` for a peer (default: collective_timeout(os.environ)); MPI's have no timeout."""
    if devices != 1:
        raise FirescaleError(f"devices is {devices}, but the PyTorch backend runs one device per rank; a net split "
                             "over devices needs the TensorFlow backend")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    place = launcher_place(os.environ)
    backend = choose_process_group(process_group, cuda, place, os.environ)
    if place.size > 1 and place.mpi:
        place = local_of_mpi(place)
    local_rank, local_size = place.local_rank or 0, place.local_size or 1
    device = _gpu(place) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # cuDNN's deterministic kernels, chosen by rule rather than by timing.  torch.use_deterministic_algorithms
        # is the trainer's to call: it imports torch._inductor, seconds of each rank's start.
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.set_num_threads(threads)
    met, comm = "", None
    if place.size > 1 and backend == "mpi":
        comm = mpi_group.open_group(place)
    waits = 0.0
    if place.size > 1 and backend != "mpi":
        waits = collective_timeout(os.environ) if collective_timeout_s is None else collective_timeout_s
        store, host, port = rendezvous(place, os.environ, timedelta(seconds=timeout_s))
        met = f"{host}:{port}"
        _all_arrive(store, place, timeout_s)   # the start waits for late ranks, not the collectives' timeout
        dist.init_process_group(backend, store=store, rank=place.rank, world_size=place.size,
                                timeout=timedelta(seconds=waits), device_id=device if backend == "nccl" else None)
    # Pinned last, so that the threads the process group and MPI started keep to the rank's core too.
    pinned = [] if cuda else pin_cpus(local_rank, local_size)
    return Rank(place.rank, place.size, local_rank, local_size, str(device), pinned,
                backend if place.size > 1 else "none", rendezvous=met, comm=comm, timeout_s=waits)


class FlatSum:
    """The learnt gradients and the (loss, stop flag) pair summed over the ranks in one buffer made once.

    Each iteration copies the gradients and the pair into their slots of the buffer (one call), sums it in
    place (`Rank.start_sum`) and hands back the slots' views: no buffer allocated, split or reshaped per
    iteration (DistributedDataParallel's gradient_as_bucket_view does the same for its buckets).  The summed
    gradients are therefore this iteration's: the next sum writes over them, which the update, their only
    reader, has used by then.  The pair is copied out, since the loop keeps every pair until it reads them.
    `shapes` must share one dtype and device (`fits`); one rank sums nothing."""

    def __init__(self, rank: Rank, shapes: Sequence[torch.Tensor]) -> None:
        if not self.fits(shapes):
            raise FirescaleError("FlatSum sums tensors of one dtype on one device")
        self.rank = rank
        sizes = [t.numel() for t in shapes]
        total = sum(sizes)
        self.flat = torch.empty(total + 2, dtype=shapes[0].dtype, device=shapes[0].device)
        self.views = [piece.view_as(t) for piece, t in zip(self.flat[:total].split(sizes), shapes)]
        self._slots = [*self.views, self.flat[total], self.flat[total + 1]]   # the pair's: 0-dim views
        self._pair = self.flat[total:]

    @staticmethod
    def fits(tensors: Sequence[torch.Tensor]) -> bool:
        return bool(tensors) and len({(t.dtype, t.device) for t in tensors}) == 1

    def __call__(self, grads: Sequence[torch.Tensor], loss_sum: torch.Tensor,
                 flag: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the summed gradients, views of the buffer; the summed (loss, flag), a tensor of its own)."""
        with torch.no_grad():
            torch._foreach_copy_(self._slots, [*grads, loss_sum, flag])
            if self.rank.size > 1:
                self.rank.wait(self.rank.start_sum(self.flat))
            return self.views, self._pair.clone()


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

    def __init__(self, rank: Rank, parameters: Iterable[torch.Tensor], bucket_bytes: int | None = None):
        bucket_bytes = default_bucket_bytes() if bucket_bytes is None else bucket_bytes
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
        self._started.append((flat, self.rank.start_sum(flat)))

    def wait(self) -> list[torch.Tensor]:
        """The gradients summed over all ranks, one per parameter; ready for the next backward."""
        if self.rank.size == 1:
            return [self._gradient(i) for i in range(len(self.parameters))]
        while len(self._started) < len(self.buckets):   # buckets some of whose gradients never came
            self._start(len(self._started))
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.parameters)
        for members, (flat, work) in zip(self.buckets, self._started):
            self.rank.wait(work)
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
                       overlap: bool = False, bucket_bytes: int | None = None) -> ProcessGroupAllreduce:
    """Which allreduce summed the gradients: what the job asked for (FIRESCALE_ALLREDUCE), the library that carried
    them (the process group's NCCL or Gloo, or for the MPI group the MPI library beneath mpi4py), the algorithm its
    settings select, decoded by the same vocabulary that set them (firescale.cluster.collectives), with its cost
    model; and whether buckets of `bucket_bytes` overlapped the backward pass (`overlap`) or one grouped sum of
    `gradient_bytes` followed it."""
    library = rank.process_group if rank.size > 1 else "none"
    if library == "mpi":   # MPI_Allreduce follows the site's Open MPI settings, as Horovod's does
        library = mpi_implementation()
    buckets = int(bucket_bytes or default_bucket_bytes()) if overlap else None
    message = None
    if gradient_bytes is not None:
        message = min(int(gradient_bytes), buckets) if buckets else int(gradient_bytes)
    # Gloo's allreduce of CPU tensors is its ring (gloo/allreduce.cc runs `ring` unless BCUBE is asked for, and
    # ProcessGroupGloo asks for nothing), whatever FIRESCALE_ALLREDUCE requested: decode_allreduce says "gloo ring".
    # NCCL follows NCCL_ALGO, which a GPU site's job exports for its allreduce.algorithm.
    settings = allreduce_settings(env, rank, library=library if library != "none" else "gloo",
                                  message_bytes=message, overlap=overlap)
    cpu = {"gloo": "gloo", "mpi": "mpi"}.get(rank.process_group, "none")   # under NCCL they go to the GPU first
    return ProcessGroupAllreduce(controller="mpi4py" if rank.process_group == "mpi" else "torch.distributed",
                                 cpu_operations=cpu, horovod_knobs={}, collectives=collectives_record(rank),
                                 process_group=rank.process_group, bucket_bytes=buckets, **settings)


def collectives_record(rank: Rank) -> dict[str, Any]:
    """For the run record: the library that summed the gradients and which backends this torch was built with."""
    library = LIBRARY_NAMES.get(rank.process_group, "none")
    return {"library": library, "gpu_operations": library if library == "NCCL" else None,
            "gloo_available": dist.is_gloo_available(), "nccl_available": dist.is_nccl_available(),
            "mpi_available": dist.is_mpi_available()}


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()   # (major, minor, patch); an int in old releases
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def versions(rank: Rank) -> dict[str, str | None]:
    """Versions of the stack that produced a result, torch's and its libraries' among them (None: not in this
    build, or not on this node)."""
    cuda = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version()
    return stack_versions({
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None if cudnn is None else str(cudnn),
        "nccl": _nccl_version() if cuda and dist.is_nccl_available() else None,
        "process_group": rank.process_group,
        # the MPI beneath the MPI group, as linked (MPI_Get_library_version); `mpi` is mpirun's, as Horovod's
        "mpi_library": mpi_group.library_version() if rank.process_group == "mpi" else None,
    })
