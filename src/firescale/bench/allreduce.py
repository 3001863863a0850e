"""FireCaffe's Figure 4 experiment: time parameter-server, tree and ring gradient aggregation with MPI.

`horovod` times the allreduce the TensorFlow trainer itself calls (Horovod's TensorFlow op, summing a float32
tensor, inside a graph): the MPI algorithm plus what the framework adds per call (queueing the op, the
background thread's negotiation cycle, a freshly allocated output).  It is the measurement to
calibrate the communication factor from, since that is the cost a training iteration pays.  After a
step (`compute_s`), it runs in the shape of the trainer's iteration (`HorovodIteration`).  `torch` times
the PyTorch trainer's (`Rank.sum` over its process group: MPI through mpi4py or Gloo on CPUs, NCCL on GPUs,
bench/allreduce_torch.py), as the MPI algorithms are timed, once for each process group asked for.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from firescale.errors import FirescaleError

BENCH_ALGORITHMS = ("ps", "tree", "ring", "mpi", "horovod", "torch")
# Each framework's own allreduce, the one its trainer calls; a run times one framework's (firescale.train.backend).
FRAMEWORK_ALGORITHMS = {"tensorflow": "horovod", "pytorch": "torch"}
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


def _horovod_world(comm: Any) -> None:
    """Horovod initialised on the world MPI already has (once), or an error when they disagree."""
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        hvd.init()
    if hvd.size() != comm.Get_size():
        raise FirescaleError(f"Horovod sees {hvd.size()} ranks but MPI {comm.Get_size()}; launch with mpirun")


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
    which a single tensor is spared (0.6 ms of 3.2 for lenet_same's 8 gradients, 5 MB, here).
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

        _horovod_world(comm)
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


# A bound on what one core computes (float32): a matmul can take no less than its flops at this rate.
MATMUL_PEAK_FLOPS = 1e12


def agreed_matmul_seconds(estimates: Sequence[float], *, floor_s: float) -> float:
    """The seconds a matmul of the synthetic step takes, agreed by the ranks from their own `estimates`:
    their median, so that every rank computes the same step (a rank with a longer one makes the others
    wait, and the probe counts that wait as the allreduce's), and no less than `floor_s`.  An estimate of
    0 or less (the matmuls timed no slower than none) is left out; all of them so, the step cannot be
    sized."""
    valid = [e for e in estimates if e > 0]
    if not valid:
        raise FirescaleError(f"the synthetic step could not be sized: on every one of {len(estimates)} ranks its "
                             "matmuls timed no slower than none (a core too busy to measure on)")
    return max(statistics.median(valid), floor_s)


def _one_thread(tf: Any) -> None:
    """TensorFlow on one thread, one core per rank as the trainer runs (left as it is once TensorFlow started)."""
    for set_threads in (tf.config.threading.set_intra_op_parallelism_threads,
                        tf.config.threading.set_inter_op_parallelism_threads):
        try:
            set_threads(1)
        except RuntimeError:        # TensorFlow already started in this process
            pass


class HorovodIteration:
    """Horovod's allreduce inside an iteration shaped as the trainer's (`Trainer._whole_iteration`): on the
    host, a batch of images and labels and the step's scalars (seed, rate, iteration, batch, stop flag)
    become the arguments of one concrete function, which computes (square matmuls, single-threaded,
    standing in for the forward and backward pass), sums what it computed over the ranks (one grouped
    allreduce of the gradient tensors and the loss pair, or one tensor) and applies the sums to variables
    (the update); and the same function with the allreduce left out, which times the rest.

    The trainer's allreduce waits inside its one graph call for Horovod's next negotiation cycle
    (model/cycle.py), and where in the cycle its request falls depends on what the rank's core does
    between requests.  Measured here: an allreduce called apart, after a step computed outside the graph,
    paid 1.4-2.2 ms where the trainer paid about 1 ms, and the same graph called without the host's work
    in between paid most of a cycle where the trainer paid almost none (performance-model.md).  The
    matmul count is sized so that the iteration without the allreduce takes about `target_s` here, the
    same count on every rank (`comm`: the ranks time their matmuls together and agree on one cost).
    """

    def __init__(self, send: Any, tensors: Sequence[int], target_s: float, *, batch: int = 1,
                 input_shape: Sequence[int] = (1, 1, 1), size: int = 128, seed: int = 0,
                 window_s: float = 0.0, comm: Any = None) -> None:
        import numpy as np
        import tensorflow as tf

        _one_thread(tf)
        sizes = list(tensors) or [len(send)]
        self._grouped = bool(tensors)
        self._inputs = [tf.constant(p) for p in np.split(send, np.cumsum(sizes)[:-1])]
        self._weights = [tf.Variable(tf.zeros_like(t)) for t in self._inputs]
        # a variable, not a constant: Grappler would fold matmuls of a constant when it optimises the graph
        self._a = tf.Variable(tf.random.stateless_uniform((size, size), seed=(1, 2)))
        rng = np.random.default_rng(seed)
        self._batches = [(rng.random((batch, *input_shape), dtype=np.float32),
                          rng.integers(0, 10, batch, dtype=np.int64)) for _ in range(4)]
        self._batch, self._calls = batch, 0
        self._result: Any = None
        probe_matmuls = 32
        (_, alone), (_, loaded) = self._trace(0), self._trace(probe_matmuls)
        mine = self._sizing(alone, loaded, probe_matmuls, comm)
        peers = comm.allgather(mine) if comm is not None else [mine]   # (base, per matmul) of every rank
        base = statistics.median(b for b, _ in peers)
        per = agreed_matmul_seconds([e for _, e in peers], floor_s=2 * size ** 3 / MATMUL_PEAK_FLOPS)
        self.matmuls = max(0, round((target_s - base) / per))
        self._with, self._without = self._trace(self.matmuls)
        # the compute an overlapped allreduce can hide behind (backward), sized as the step is
        self._window = self._trace(max(0, round((window_s - base) / per)))[1] if window_s > 0 else None
        self._requests: Any = self._trace_requests() if window_s > 0 else None

    def _sizing(self, alone: Any, loaded: Any, matmuls: int, comm: Any) -> tuple[float, float]:
        """This rank's iteration without matmuls and what one matmul adds to it, the fastest of 15 calls of
        each, in turn.  All ranks time them at once (after a barrier), as they compute in the probe: a rank
        sharing its core with one still tracing its graphs timed its empty iteration slow and its matmuls
        no slower, sized its step at tens of thousands of matmuls, and traced that graph for minutes."""
        self._call(alone)
        self._call(loaded)
        if comm is not None:
            comm.Barrier()
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(15):
            for fn, kept in ((alone, times[0]), (loaded, times[1])):
                start = time.perf_counter()
                self._call(fn)
                kept.append(time.perf_counter() - start)
        base = min(times[0])
        return base, (min(times[1]) - base) / matmuls

    def _trace(self, matmuls: int) -> tuple[Any, Any]:
        """The iteration with Horovod's allreduce and without it, for `matmuls` matmuls of compute, as
        concrete functions of the trainer's arguments."""
        import horovod.tensorflow as hvd
        import tensorflow as tf

        images, labels = self._batches[0]
        specs = (tf.TensorSpec((None, *images.shape[1:]), tf.float32), tf.TensorSpec((None,), tf.int64),
                 tf.TensorSpec((2,), tf.int64), tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.int64),
                 tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.float32))

        def iteration(reduce: bool) -> Any:
            def body(images: Any, labels: Any, seed: Any, rate: Any, step: Any, batch: Any, flag: Any) -> Any:
                # The compute depends on the batch and the gradients on the compute; both terms are 0 (the
                # images and the matmuls are >= 0), which Grappler cannot know: it drops a product with 0.0,
                # and the matmuls with it.
                x = self._a + tf.minimum(tf.reduce_sum(images), 0.0)
                for _ in range(matmuls):
                    x = tf.linalg.matmul(x, self._a) * 1e-3
                after = tf.minimum(tf.reduce_sum(x), 0.0)
                grads = [t + after for t in self._inputs]
                if self._grouped:
                    grads.append(tf.stack([after + tf.cast(tf.size(labels), tf.float32), flag]))   # loss pair
                if not reduce:
                    summed = [tf.identity(g) for g in grads]
                elif self._grouped:
                    summed = hvd.grouped_allreduce(grads, op=hvd.Sum)
                else:
                    summed = [hvd.allreduce(grads[0], op=hvd.Sum, name="bench_iteration")]
                for w, g in zip(self._weights, summed):
                    w.assign_sub(g * rate / batch)
                return summed
            return tf.function(body, autograph=False).get_concrete_function(*specs)

        return iteration(True), iteration(False)

    def _trace_requests(self) -> Any:
        """The allreduce alone, one request a tensor (the loss pair too), as the trainer's overlapped mode
        makes them (`Rank.sum_each`)."""
        import horovod.tensorflow as hvd
        import tensorflow as tf

        def requests(flag: Any) -> Any:
            tensors = [*map(tf.identity, self._inputs), *([tf.stack([flag, flag])] if self._grouped else [])]
            return [hvd.allreduce(t, op=hvd.Sum) for t in tensors]
        return tf.function(requests, autograph=False).get_concrete_function(tf.TensorSpec((), tf.float32))

    def _call(self, fn: Any) -> Any:
        """One iteration as the trainer makes it: the step's scalars and seed made on the host, the batch
        passed as arrays."""
        import tensorflow as tf

        self._calls += 1
        images, labels = self._batches[self._calls % len(self._batches)]
        return fn(images, labels, tf.constant([1, self._calls], tf.int64), tf.constant(1e-9, tf.float32),
                  tf.constant(self._calls, tf.int64), tf.constant(float(self._batch)), tf.constant(0.0))

    def with_allreduce(self) -> None:
        self._result = self._call(self._with)

    def without_allreduce(self) -> None:
        self._call(self._without)

    def window_alone(self) -> None:
        self._call(self._window)

    def overlapped_allreduce(self) -> None:
        """The allreduce's requests made as the window's compute starts (the iteration without the allreduce,
        sized to `window_s`), and that compute beside them.  The requests are a graph call of their own on a
        second Python thread.  Made inside one graph, TensorFlow's single inter-op thread ran the matmul
        chain on and held them until it ended in some calls and not in others (0-70% hidden at one step and
        link), which measured its scheduling rather than the link.  The second thread is given 0.2 ms to
        enter its call, counted in the time."""
        import threading

        import tensorflow as tf

        flag = tf.constant(0.0)
        made: dict[str, Any] = {}
        entered = threading.Event()

        def request() -> None:
            entered.set()
            try:
                made["sums"] = self._requests(flag)
            except Exception as exc:    # raised again in the calling thread, not lost with this one
                made["error"] = exc

        requester = threading.Thread(target=request)
        requester.start()
        entered.wait()
        time.sleep(0.0002)     # into TensorFlow's call, which enqueues the requests on its own
        self._call(self._window)
        requester.join()
        if "error" in made:
            raise made["error"]
        self._result = made["sums"]

    def copy_result(self, recv: Any) -> None:
        """The last sum into `recv` (the loss pair left out)."""
        import numpy as np

        sums = self._result[:len(self._inputs)]
        np.copyto(recv, np.concatenate([t.numpy() for t in sums]))


def framework_last(algorithms: list[str]) -> list[str]:
    """The order to measure in: every MPI algorithm before a framework's (Horovod's, torch.distributed's, which
    makes a process group and its threads).  Once hvd.init() has run, Horovod's
    background thread runs a coordination collective every cycle for the rest of the process, on the
    rank's core; MPI timed after that is disturbed (at 2 ranks on 2 cores, medians from 0.29 to 3.9 ms
    at 1 MiB), which a user running plain MPI never sees."""
    ours = set(FRAMEWORK_ALGORITHMS.values())
    return [a for a in algorithms if a not in ours] + [a for a in algorithms if a in ours]


IMPLEMENTATIONS: dict[str, Callable[[Any, Any, Any], None]] = {
    "ps": ps_allreduce, "tree": tree_allreduce, "ring": ring_allreduce, "mpi": mpi_allreduce,
}


@dataclass(frozen=True)
class AllreduceMeasurement:
    """Seconds for one allreduce of `bytes` over `ranks` ranks: the slowest rank, per repetition.

    With a synthetic step (`compute_s` > 0, the median of the ranks' mean step time) each repetition
    computes first and then reduces, as a training iteration does; `seconds` are then the slowest
    rank's iteration less the ranks' mean step: what communication costs an iteration, the allreduce and
    waiting for the slowest rank's step.  The MPI algorithms time the step in each repetition, which
    cancels the drift of a shared machine's speed (and of the step's own length) between repetitions.
    Horovod's runs in the trainer's iteration shape (`HorovodIteration`); its step is the same iteration
    without the allreduce, timed in blocks of repetitions that alternate with those with it, and its
    seconds are the ranks' mean iteration less that step (`allreduce_costs`), as the trainer's iteration
    is a mean.
    """

    algorithm: str
    ranks: int
    bytes: int
    seconds: list[float]
    compute_s: float = 0.0
    tensors: int = 0          # Horovod's or torch's grouped allreduce of this many tensors (+ the loss pair); 0: one
    graph_call_s: float = 0.0  # horovod: the same graph call and wait with no allreduce in it (median)
    # horovod after a step, timed too with the allreduce beside a window of compute (the backward pass an
    # overlapped allreduce can hide behind): what it then added, per repetition, and the window's median
    overlapped_seconds: list[float] = field(default_factory=list)
    window_s: float = 0.0
    process_group: str = ""    # torch: the process group that summed (gloo, mpi, nccl; none with one rank)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def hidden_share(self) -> float | None:
        """The share of the allreduce that ran beside the rank's compute when its requests were made as the
        window's compute started: its mean cost after the step less its mean cost beside the window, over
        the first, kept in [0, 1].  0: the rank's core does all of the allreduce's work, as an unshaped veth's
        or shared memory's copies; 1: it runs wholly beside the compute, on a link or device of its own.  The
        window is the backward pass the trainer can hide the allreduce behind, so the share is what the
        overlapped schedule may hide (Platform.comm_hidden_share).  None when not timed."""
        if not self.overlapped_seconds or self.window_s <= 0:
            return None
        serial = self.mean_s
        if serial <= 0:
            return 0.0
        return min(1.0, max(0.0, (serial - statistics.fmean(self.overlapped_seconds)) / serial))

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    @property
    def mean_s(self) -> float:
        """What the repetitions cost on average: after a step, Horovod's allreduce waits a varying part of its
        negotiation cycle, and training pays the mean."""
        return statistics.fmean(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        shown = {**asdict(self), "median_s": self.median_s, "min_s": self.min_s, "mean_s": self.mean_s}
        if self.overlapped_seconds:
            shown["hidden_share"] = self.hidden_share
        else:     # not timed beside compute
            del shown["overlapped_seconds"], shown["window_s"]
        if not self.process_group:
            del shown["process_group"]
        return shown


class SyntheticStep:
    """A fixed amount of single-threaded TensorFlow compute (square matmuls) standing in for a rank's
    forward and backward pass, sized to about `target_s` on this core."""

    def __init__(self, target_s: float, size: int = 128) -> None:
        import tensorflow as tf

        _one_thread(tf)
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
                      compute_s: float = 0.0, tensors: Sequence[int] = (), batch: int = 1,
                      input_shape: Sequence[int] = (1, 1, 1), overlap_s: float = 0.0,
                      process_group: str = "auto") -> AllreduceMeasurement:
    """Time `reps` allreduces of a float32 vector of `nbytes` (after `warmup`), checking the sum.

    With `tensors` (element counts, e.g. a net's gradients, `NetCost.gradient_tensors`), the vector
    is their total and Horovod sums them as one group, as the trainer does; the MPI algorithms have no
    groups and reduce the same bytes as one buffer, as a program written with plain MPI would.

    The repetitions run back to back, after one barrier, as a training loop's allreduces do.  With
    `compute_s`, each one follows a synthetic step of about that long, and the ranks' mean step time in
    that repetition is subtracted from its slowest rank's total; Horovod's runs inside an iteration
    shaped as the trainer's, fed a `batch` of `input_shape` images each time (HorovodIteration); with
    `overlap_s` also with the allreduce beside compute of about that long (`AllreduceMeasurement.hidden_share`).
    `torch` sums over `process_group` (train.backend.PROCESS_GROUPS), the measurement naming the group it resolved to.
    """
    import numpy as np
    from mpi4py import MPI

    if algorithm not in BENCH_ALGORITHMS:
        raise FirescaleError(f"unknown benchmark algorithm {algorithm!r}; known: {', '.join(BENCH_ALGORITHMS)}")
    rank, size = comm.Get_rank(), comm.Get_size()
    count = sum(tensors) if tensors else max(1, nbytes // 4)
    send = np.full(count, float(rank + 1), dtype=np.float32)
    recv = np.empty_like(send)
    if algorithm == "torch" and compute_s > 0:
        raise FirescaleError("torch.distributed's allreduce is timed on its own, not after a step (the synthetic "
                             "step is TensorFlow's): give compute_s 0")
    if overlap_s > 0 and not (algorithm == "horovod" and compute_s > 0):
        raise FirescaleError("an overlapped allreduce is timed for Horovod's, beside a step: give compute_s > 0")
    if algorithm == "horovod" and compute_s > 0:
        _horovod_world(comm)
        iteration = HorovodIteration(send, tensors, compute_s, batch=batch, input_shape=input_shape, seed=rank,
                                     window_s=overlap_s, comm=comm)
        seconds, steps, overlapped, windows = _horovod_iterations(comm, iteration, reps, warmup, overlap_s > 0)
        iteration.copy_result(recv)
        _check_sum(algorithm, size, recv)
        return AllreduceMeasurement(algorithm, size, count * 4, seconds, statistics.median(steps), len(tensors),
                                    overlapped_seconds=overlapped,
                                    window_s=statistics.median(windows) if windows else 0.0)
    run = _implementation(algorithm, tensors, process_group)
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
    graph_call_s, process_group = 0.0, ""
    framework = algorithm in FRAMEWORK_ALGORITHMS.values()
    if framework:
        run.copy_result(recv)
    if isinstance(run, HorovodAllreduce):
        graph_call_s = run.graph_call_s(reps)
    elif framework:
        process_group = run.process_group
        run.close()         # torch's process group, made again for the next measurement
    _check_sum(algorithm, size, recv)
    return AllreduceMeasurement(algorithm, size, count * 4, [float(x) for x in seconds],
                                float(statistics.median(steps)), len(tensors) if framework else 0, graph_call_s,
                                process_group=process_group)


def _implementation(algorithm: str, tensors: Sequence[int], process_group: str = "auto") -> Any:
    """What one repetition of `algorithm` calls: an MPI implementation, or a framework's allreduce (imported only
    when asked for: a run of one framework needs only its own); torch's over `process_group`."""
    if algorithm == "horovod":
        return HorovodAllreduce(tensors)
    if algorithm == "torch":
        from firescale.bench.allreduce_torch import TorchAllreduce

        return TorchAllreduce(tensors, process_group)
    return IMPLEMENTATIONS[algorithm]


def _check_sum(algorithm: str, size: int, recv: Any) -> None:
    expected = size * (size + 1) / 2
    if not (recv[0] == expected and recv[-1] == expected):
        raise FirescaleError(f"{algorithm} allreduce on {size} ranks gave {recv[0]} and {recv[-1]}, "
                             f"expected {expected}: the implementation is wrong")


ITERATION_BLOCK = 10    # repetitions with the allreduce, then as many without, in turn


def _horovod_iterations(comm: Any, iteration: HorovodIteration, reps: int, warmup: int, overlap: bool = False
                        ) -> tuple[list[float], list[float], list[float], list[float]]:
    """`reps` iterations with Horovod's allreduce, in blocks that alternate with as many without it; per
    repetition, what the allreduce added to the ranks' iteration (`allreduce_costs`), and per block the
    ranks' mean median iteration without it.  With `overlap`, each block also times the window's compute
    alone and `reps` calls with the allreduce beside it (HorovodIteration.overlapped_allreduce): the third
    list is what the allreduce then added, the fourth the window's per block (both empty without)."""
    import numpy as np

    # (timed kind, the kind alone it is measured against): the step for the allreduce after it, the window
    # for the allreduce beside it
    pairs = [(iteration.with_allreduce, iteration.without_allreduce)]
    if overlap:
        pairs.append((iteration.overlapped_allreduce, iteration.window_alone))
    for _ in range(warmup):
        for kind, alone_kind in pairs:
            alone_kind()
            kind()
    blocks = -(-reps // ITERATION_BLOCK)
    timed, alone_t = np.zeros((len(pairs), reps)), np.zeros((len(pairs), blocks))
    comm.Barrier()
    for b in range(blocks):
        for k, (kind, alone_kind) in enumerate(pairs):
            alone = []
            for _ in range(ITERATION_BLOCK):
                start = time.perf_counter()
                alone_kind()
                alone.append(time.perf_counter() - start)
            alone_t[k, b] = statistics.median(alone)
            kind()      # untimed: the ranks come out of their blocks alone at different times
            for rep in range(b * ITERATION_BLOCK, min(reps, (b + 1) * ITERATION_BLOCK)):
                start = time.perf_counter()
                kind()
                timed[k, rep] = time.perf_counter() - start
    # Gathered once, after the timed calls (see measure_allreduce).
    costs = []
    for k in range(len(pairs)):
        with_all, alone_all = np.empty((comm.Get_size(), reps)), np.empty((comm.Get_size(), blocks))
        comm.Allgather(np.ascontiguousarray(timed[k]), with_all)
        comm.Allgather(np.ascontiguousarray(alone_t[k]), alone_all)
        costs.append(allreduce_costs(with_all, alone_all))
    seconds, steps = costs[0]
    return (seconds, steps, *costs[1]) if overlap else (seconds, steps, [], [])


def allreduce_costs(with_t: Any, without_t: Any) -> tuple[list[float], list[float]]:
    """Per repetition, the ranks' mean iteration with the allreduce less their mean iteration without it
    in the same block; and those means, per block.  `with_t` is (ranks, repetitions) seconds, `without_t`
    (ranks, blocks of ITERATION_BLOCK repetitions).

    The mean over the ranks, not the slowest rank: the allreduce holds the ranks in step, so over a run
    each rank spends the same time, but where one repetition ends and the next begins differs by rank
    (each rank's thread wakes when its core lets it), and a long repetition on one rank is a short one on
    the other.  The slowest rank's time per repetition then counts that jitter as cost: 0.06-0.11 ms of
    a 1.2-1.4 ms allreduce probe measured at 2 ranks here, where the trainer's mean iteration, the figure
    the probe predicts, pays none of it."""
    import numpy as np

    with_mean = np.mean(np.asarray(with_t, dtype=float), axis=0)
    steps = np.mean(np.asarray(without_t, dtype=float), axis=0)
    seconds = [float(with_mean[rep] - steps[rep // ITERATION_BLOCK]) for rep in range(len(with_mean))]
    return seconds, [float(x) for x in steps]


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


@dataclass(frozen=True)
class TorchVsMpi:
    """The PyTorch trainer's allreduce over one process group beside MPI_Allreduce of the same buffer, measured in
    the same run: medians, and the fastest repetitions (on a shared machine, the least disturbed)."""

    bytes: int
    ranks: int
    mpi_s: float
    torch_s: float
    mpi_min_s: float
    torch_min_s: float
    process_group: str = ""

    @property
    def percent_of_mpi(self) -> float:
        """torch's rate (bytes per second) in percent of MPI's: MPI's median time over torch's."""
        return 100.0 * self.mpi_s / self.torch_s if self.torch_s > 0 else 0.0

    @property
    def best_percent_of_mpi(self) -> float:
        return 100.0 * self.mpi_min_s / self.torch_min_s if self.torch_min_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "percent_of_mpi": self.percent_of_mpi, "best_percent_of_mpi": self.best_percent_of_mpi}


def torch_vs_mpi(measurements: list[AllreduceMeasurement]) -> list[TorchVsMpi]:
    """One comparison per size and process group that has both an `mpi` and a `torch` measurement, smallest size
    first, each size's groups in the order they were measured."""
    mpi = {m.bytes: m for m in measurements if m.algorithm == "mpi"}
    ours = sorted((m for m in measurements if m.algorithm == "torch" and m.bytes in mpi), key=lambda m: m.bytes)
    return [TorchVsMpi(t.bytes, mpi[t.bytes].ranks, mpi[t.bytes].median_s, t.median_s, mpi[t.bytes].min_s, t.min_s,
                       t.process_group) for t in ours]
