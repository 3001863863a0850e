"""FireCaffe's Figure 4 experiment: time parameter-server, tree and ring gradient aggregation with MPI.

`horovod` times the allreduce the trainer itself calls (Horovod's TensorFlow op, summing a float32
tensor, inside a graph): the MPI algorithm plus what the framework adds per call (queueing the op, the
background thread's negotiation cycle, a freshly allocated output).  It is the measurement to
calibrate the communication factor from, since that is the cost a training iteration pays.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from firescale.errors import FirescaleError

BENCH_ALGORITHMS = ("ps", "tree", "ring", "mpi", "horovod")
SWEEP_BYTES = tuple(64 * 1024 * 4 ** k for k in range(6))   # 64 KiB, 256 KiB, 1 MiB, ... 64 MiB


def ps_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Parameter server on rank 0: receive every worker's gradient in turn, sum, send the sum to each."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        np.copyto(recv, send)
        incoming = np.empty_like(send)
        for worker in range(1, size):
            comm.Recv(incoming, source=worker, tag=11)
            recv += incoming
        for worker in range(1, size):
            comm.Send(recv, dest=worker, tag=12)
    else:
        comm.Send(send, dest=0, tag=11)
        comm.Recv(recv, source=0, tag=12)


def tree_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Binomial tree: reduce to rank 0 in ceil(log2 p) rounds, then broadcast back down the same tree."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    np.copyto(recv, send)
    incoming = np.empty_like(send)
    mask = 1
    while mask < size:                      # reduce: at round k, ranks with bit k set send and stop
        if rank & mask:
            comm.Send(recv, dest=rank - mask, tag=21)
            break
        if rank + mask < size:
            comm.Recv(incoming, source=rank + mask, tag=21)
            recv += incoming
        mask <<= 1
    # broadcast: walk the same tree from the root outwards
    mask = 1
    while mask < size:
        mask <<= 1
    mask >>= 1
    while mask >= 1:
        if rank % (2 * mask) == 0 and rank + mask < size:
            comm.Send(recv, dest=rank + mask, tag=22)
        elif rank % (2 * mask) == mask:
            comm.Recv(recv, source=rank - mask, tag=22)
        mask >>= 1


def ring_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Ring: p-1 reduce-scatter steps then p-1 allgather steps, each passing one 1/p chunk on."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    np.copyto(recv, send)
    if size == 1:
        return
    bounds = np.linspace(0, recv.size, size + 1).astype(int)
    chunk = [recv[bounds[i]:bounds[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    scratch = np.empty(max(len(c) for c in chunk), dtype=recv.dtype)
    for step in range(size - 1):            # reduce-scatter
        out_i, in_i = (rank - step) % size, (rank - step - 1) % size
        buf = scratch[:len(chunk[in_i])]
        comm.Sendrecv(chunk[out_i], dest=right, sendtag=31, recvbuf=buf, source=left, recvtag=31)
        chunk[in_i] += buf
    for step in range(size - 1):            # allgather
        out_i, in_i = (rank + 1 - step) % size, (rank - step) % size
        buf = scratch[:len(chunk[in_i])]
        comm.Sendrecv(chunk[out_i], dest=right, sendtag=32, recvbuf=buf, source=left, recvtag=32)
        chunk[in_i][...] = buf


def mpi_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """MPI_Allreduce with whatever algorithm the MPI library (and its MCA settings) chooses."""
    from mpi4py import MPI

    comm.Allreduce(send, recv, op=MPI.SUM)


class HorovodAllreduce:
    """hvd.allreduce(op=Sum) on a TensorFlow tensor, called as the trainer calls it: inside a graph.

    The tensor is made from `send` on the first (warm-up) call, as a training step's gradients
    already are tensors, and the sum stays a tensor, as the update reads it: the host waits on its
    first element only.  (`.numpy()` of the whole sum would add a host copy of the buffer, 1.2 ms of
    9 at 16 MiB, 12 of 59 at 64 MiB, that no training step makes.)  Horovod is initialised on first
    use, on the world MPI already has.

    With `tensors` (element counts adding up to `send`'s), `send` is cut into tensors of those sizes
    and they are summed as the trainer sums a net's gradients: one grouped allreduce of them and of
    the loss and stop flag pair.  Horovod then copies them into its fusion buffer and back out,
    which a single tensor is spared (0.6 ms of 3.2 for LeNet's 8 gradients, 5 MB, here).
    """

    def __init__(self, tensors: Sequence[int] = ()) -> None:
        self._sizes = tuple(tensors)
        self._inputs: Any = None
        self._result: Any = None
        self._reduce: Any = None

    def __call__(self, comm: Any, send: Any, recv: Any) -> None:
        import horovod.tensorflow as hvd
        import numpy as np
        import tensorflow as tf

        if not hvd.is_initialized():
            hvd.init()
        if hvd.size() != comm.Get_size():
            raise FirescaleError(f"Horovod sees {hvd.size()} ranks but MPI {comm.Get_size()}; launch with mpirun")
        if self._inputs is None:
            if self._sizes:
                parts = np.split(send, np.cumsum(self._sizes)[:-1])
                self._inputs = [tf.constant(p) for p in parts] + [tf.constant(send[:2])]   # + loss, stop flag
                self._reduce = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))
            else:
                self._inputs = tf.constant(send)
                self._reduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench_allreduce"))
        self._result = self._reduce(self._inputs)
        self._wait(self._result)

    def _wait(self, out: Any) -> None:
        """Wait for a call's result by reading its first element (a group completes together)."""
        _ = (out[0] if self._sizes else out)[:1].numpy()

    def graph_call_s(self, reps: int) -> float:
        """Median seconds of the same call with `tf.identity` in place of the allreduce (after a first call):
        what calling a TensorFlow graph from Python and waiting on its first element costs on its own.
        A training step pays it once per iteration whatever the graph holds; MPI_Allreduce from Python
        does not pay it at all.  Call after the timed calls, on the inputs they used."""
        import tensorflow as tf

        copy = tf.function(lambda ts: tf.nest.map_structure(tf.identity, ts))
        times = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            self._wait(copy(self._inputs))
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    def copy_result(self, recv: Any) -> None:
        """The last sum into `recv` (outside the timed calls: MPI_Allreduce writes there itself)."""
        import numpy as np

        sums = [t.numpy() for t in self._result[:-1]] if self._sizes else [self._result.numpy()]
        np.copyto(recv, np.concatenate(sums))


def horovod_last(algorithms: list[str]) -> list[str]:
    """The order to measure in: every MPI algorithm before Horovod's.  Once hvd.init() has run, Horovod's
    background thread runs a coordination collective every cycle for the rest of the process, on the
    rank's core; MPI timed after that is disturbed (at 2 ranks on 2 cores, medians from 0.29 to 3.9 ms
    at 1 MiB), which a user running plain MPI never sees."""
    return [a for a in algorithms if a != "horovod"] + [a for a in algorithms if a == "horovod"]


IMPLEMENTATIONS: dict[str, Callable[[Any, Any, Any], None]] = {
    "ps": ps_allreduce, "tree": tree_allreduce, "ring": ring_allreduce, "mpi": mpi_allreduce,
}


@dataclass(frozen=True)
class AllreduceMeasurement:
    """Seconds for one allreduce of `bytes` over `ranks` ranks: the slowest rank, per repetition.

    With a synthetic step (`compute_s` > 0, the median of the ranks' mean step time) each repetition
    computes first and then reduces, as a training iteration does; `seconds` are then the slowest
    rank's iteration less the ranks' mean step in that same repetition: what communication costs an
    iteration, the allreduce and waiting for the slowest rank's step.  Timing the step in each
    repetition cancels the drift of a shared machine's speed (and of the step's own length) between
    repetitions.
    """

    algorithm: str
    ranks: int
    bytes: int
    seconds: list[float]
    compute_s: float = 0.0
    tensors: int = 0          # Horovod's grouped allreduce of this many tensors (+ the loss pair); 0: one buffer
    graph_call_s: float = 0.0  # horovod: the same graph call and wait with no allreduce in it (median)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_s": self.median_s, "min_s": self.min_s}


class SyntheticStep:
    """A fixed amount of single-threaded TensorFlow compute (square matmuls) standing in for a rank's
    forward and backward pass, sized to about `target_s` on this core."""

    def __init__(self, target_s: float, size: int = 128) -> None:
        import tensorflow as tf

        for set_threads in (tf.config.threading.set_intra_op_parallelism_threads,
                            tf.config.threading.set_inter_op_parallelism_threads):
            try:
                set_threads(1)          # one core per rank, as the trainer runs
            except RuntimeError:        # TensorFlow already started in this process
                pass
        self._a = tf.random.stateless_uniform((size, size), seed=(1, 2))
        self.matmuls = 1
        one = min(self.timed() for _ in range(15))
        self.matmuls = max(1, round(target_s / one))

    def run(self) -> None:
        import tensorflow as tf

        x = self._a
        for _ in range(self.matmuls):
            x = tf.linalg.matmul(x, self._a) * 1e-3
        x.numpy()

    def timed(self) -> float:
        start = time.perf_counter()
        self.run()
        return time.perf_counter() - start


def measure_allreduce(comm: Any, algorithm: str, nbytes: int, reps: int, warmup: int = 1,
                      compute_s: float = 0.0, tensors: Sequence[int] = ()) -> AllreduceMeasurement:
    """Time `reps` allreduces of a float32 vector of `nbytes` (after `warmup`), checking the sum.

    With `tensors` (element counts, e.g. a net's gradients, `NetCost.gradient_tensors`), the vector
    is their total and Horovod sums them as one group, as the trainer does; the MPI algorithms have no
    groups and reduce the same bytes as one buffer, as a program written with plain MPI would.

    The repetitions run back to back, after one barrier, as a training loop's allreduces do.  With
    `compute_s`, each one follows a synthetic step of about that long, and the ranks' mean step time in
    that repetition is subtracted from its slowest rank's total.
    """
    import numpy as np
    from mpi4py import MPI

    if algorithm not in BENCH_ALGORITHMS:
        raise FirescaleError(f"unknown benchmark algorithm {algorithm!r}; known: {', '.join(BENCH_ALGORITHMS)}")
    rank, size = comm.Get_rank(), comm.Get_size()
    count = sum(tensors) if tensors else max(1, nbytes // 4)
    send = np.full(count, float(rank + 1), dtype=np.float32)
    recv = np.empty_like(send)
    run = HorovodAllreduce(tensors) if algorithm == "horovod" else IMPLEMENTATIONS[algorithm]
    step = SyntheticStep(compute_s) if compute_s > 0 else None
    local = np.zeros((warmup + reps, 2))      # per repetition: this rank's total and its step
    comm.Barrier()
    for rep in range(warmup + reps):
        start = time.perf_counter()
        stepped = step.timed() if step is not None else 0.0
        run(comm, send, recv)
        local[rep] = time.perf_counter() - start, stepped
    # Gathered once, after the timed calls: an MPI call between repetitions would run beside Horovod's
    # background thread and delay its next cycle.  Each allreduce holds the ranks in step, so the slowest
    # rank's time per repetition is what that repetition cost.
    slowest, summed = np.empty(len(local)), np.empty(len(local))
    comm.Allreduce(np.ascontiguousarray(local[:, 0]), slowest, op=MPI.MAX)
    comm.Allreduce(np.ascontiguousarray(local[:, 1]), summed, op=MPI.SUM)
    mean_steps = summed[warmup:] / size
    seconds, steps = list(slowest[warmup:] - mean_steps), list(mean_steps)
    graph_call_s = 0.0
    if isinstance(run, HorovodAllreduce):
        run.copy_result(recv)
        graph_call_s = run.graph_call_s(reps)
    expected = size * (size + 1) / 2
    if not (recv[0] == expected and recv[-1] == expected):
        raise FirescaleError(f"{algorithm} allreduce on {size} ranks gave {recv[0]} and {recv[-1]}, "
                             f"expected {expected}: the implementation is wrong")
    return AllreduceMeasurement(algorithm, size, count * 4, [float(x) for x in seconds],
                                float(statistics.median(steps)), len(tensors) if algorithm == "horovod" else 0,
                                graph_call_s)


@dataclass(frozen=True)
class HorovodVsMpi:
    """Horovod's allreduce beside MPI_Allreduce of the same buffer, measured in the same run."""

    bytes: int
    ranks: int
    mpi_s: float           # medians
    horovod_s: float
    mpi_min_s: float       # fastest repetitions: on a shared machine, the least disturbed
    horovod_min_s: float
    graph_call_s: float = 0.0   # of Horovod's time, calling the graph from Python and waiting (no allreduce)

    @property
    def percent_of_mpi(self) -> float:
        """Horovod's rate (bytes per second) in percent of MPI's: MPI's median time over Horovod's."""
        return 100.0 * self.mpi_s / self.horovod_s if self.horovod_s > 0 else 0.0

    @property
    def best_percent_of_mpi(self) -> float:
        """The same from the fastest repetition of each."""
        return 100.0 * self.mpi_min_s / self.horovod_min_s if self.horovod_min_s > 0 else 0.0

    @property
    def in_graph_percent_of_mpi(self) -> float:
        """Horovod's rate with the graph call's own cost taken out (medians): the allreduce as a training
        step, which makes that call anyway, pays for it."""
        own = self.horovod_s - self.graph_call_s
        return 100.0 * self.mpi_s / own if own > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "percent_of_mpi": self.percent_of_mpi, "best_percent_of_mpi": self.best_percent_of_mpi,
                "in_graph_percent_of_mpi": self.in_graph_percent_of_mpi}


def horovod_vs_mpi(measurements: list[AllreduceMeasurement]) -> list[HorovodVsMpi]:
    """One comparison per size that has both an `mpi` and a `horovod` measurement (medians), smallest first."""
    by = {(m.algorithm, m.bytes): m for m in measurements}
    sizes = sorted({m.bytes for m in measurements})
    return [HorovodVsMpi(n, by["mpi", n].ranks, by["mpi", n].median_s, by["horovod", n].median_s,
                         by["mpi", n].min_s, by["horovod", n].min_s, by["horovod", n].graph_call_s)
            for n in sizes if ("mpi", n) in by and ("horovod", n) in by]
