"""The TensorFlow trainer's allreduce as it calls it, for `bench allreduce`: its backend's own rank and `Rank.sum`.

The rank is the one the trainer starts (`load_backend("tensorflow").init_rank`: Horovod initialised, the rank
pinned and single-threaded, deterministic ops), made once per process; the sums are its `Rank.sum` (one grouped
Horovod allreduce, as the trainer's traced iteration sums a net's gradients with the loss and stop flag) and its
`Rank.sum_each` (one request a tensor, as the overlapped iteration makes them), both called inside a graph.

Alone (`HorovodAllreduce`) it is timed as the MPI algorithms are (bench/mpi_algorithms.py).  After a step
(`after_step`), since Horovod's negotiation cycle makes its time depend on the step before it, it runs in the
trainer's iteration itself (`HorovodIteration`): the function train/tensorflow/steps.py traces for training
(`trace_iteration`), with a real solver, traced around a stand-in net (`StandInNet`) whose loss and gradients
are matmuls in place of a net's forward and backward pass: the step is of the length asked for (a
calibration asks for the step it measured), where a net's own would take what it takes.
"""
from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.bench.iteration_blocks import alternating_blocks
from firescale.bench.mpi_algorithms import check_sum, launcher_placement
from firescale.errors import FirescaleError
from firescale.frameworks import TENSORFLOW

if TYPE_CHECKING:
    from firescale.train.tensorflow.steps import Compute

# A bound on what one core computes (float32): a matmul can take no less than its flops at this rate.
MATMUL_PEAK_FLOPS = 1e12


def one_thread() -> None:
    """TensorFlow on one thread, one core per rank as the trainer runs it (init_rank asks the same again)."""
    import tensorflow as tf

    for set_threads in (tf.config.threading.set_intra_op_parallelism_threads,
                        tf.config.threading.set_inter_op_parallelism_threads):
        try:
            set_threads(1)
        except RuntimeError:        # TensorFlow already started in this process (left as it is)
            pass


@functools.cache
def trainer_rank(ranks: int) -> Any:
    """The TensorFlow backend's rank, started as the trainer starts it (once per process), then given back the
    cores its launcher placed it on (the MPI algorithms were timed there); an error where Horovod sees other
    than MPI's `ranks` ranks."""
    from firescale.train.backend import load_backend

    one_thread()
    with launcher_placement():
        rank = load_backend(TENSORFLOW.name).init_rank(1, 1)
    if rank.size != ranks:
        raise FirescaleError(f"Horovod sees {rank.size} ranks but MPI {ranks}; launch with mpirun")
    return rank


def _inputs(send: Any, sizes: Sequence[int]) -> list[Any]:
    """`send` as the tensors the trainer sums: cut into `sizes` (a net's gradients) and the loss and stop flag
    pair, or one tensor."""
    import numpy as np
    import tensorflow as tf

    if not sizes:
        return [tf.constant(send)]
    return [tf.constant(p) for p in np.split(send, np.cumsum(sizes)[:-1])] + [tf.constant(send[:2])]


class HorovodAllreduce:
    """The trainer's `Rank.sum` of `send`, inside a graph, as its iteration calls it: one tensor, or with `tensors`
    (element counts adding up to `send`'s) `send` cut into tensors of those sizes and the loss pair.

    The tensors are made on the first (warm-up) call, as a training step's gradients already are tensors, and
    the sum stays a tensor, as the update reads it: the host waits on its first element only (a copy of the
    whole sum to the host is a cost no training step pays: docs/benchmarks/2026-11-23-zen4.md, "How the
    benchmark was wrong before").  A group makes Horovod copy the tensors into its fusion buffer and back, which
    one tensor is spared (docs/benchmarks/2026-11-23-zen5.md, "Tensor grouping")."""

    def __init__(self, tensors: Sequence[int] = ()) -> None:
        self._sizes = tuple(tensors)
        self._inputs: list[Any] = []
        self._result: Any = None
        self._reduce: Any = None

    def __call__(self, comm: Any, send: Any, recv: Any) -> None:
        import tensorflow as tf

        if self._reduce is None:
            rank = trainer_rank(comm.Get_size())
            self._inputs = _inputs(send, self._sizes)
            self._reduce = tf.function(rank.sum, autograph=False)
        self._result = self._reduce(self._inputs)
        self._wait(self._result)

    @staticmethod
    def _wait(out: Any) -> None:
        """Wait for a call's result by reading its first element (a group completes together)."""
        _ = out[0][:1].numpy()

    def graph_call_s(self, reps: int) -> float:
        """Median seconds of the same call with `tf.identity` in place of the allreduce (after a first call):
        what calling a TensorFlow graph from Python and waiting on its first element costs on its own.
        A training step pays it once per iteration whatever the graph holds; MPI_Allreduce from Python
        does not pay it at all.  Call after the timed calls, on the inputs they used."""
        import tensorflow as tf

        copy = tf.function(lambda ts: [tf.identity(t) for t in ts], autograph=False)
        times = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            self._wait(copy(self._inputs))
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    def copy_result(self, recv: Any) -> None:
        """The last sum into `recv`, the loss pair left out (outside the timed calls: MPI_Allreduce writes there
        itself)."""
        import numpy as np

        sums = self._result[:-1] if self._sizes else self._result
        np.copyto(recv, np.concatenate([t.numpy() for t in sums]))

    def finish(self, reps: int) -> dict[str, Any]:
        """What the measurement records beside the times: the graph call's own cost."""
        return {"graph_call_s": self.graph_call_s(reps)}


def allreduce(tensors: Sequence[int] = (), process_group: str = "auto") -> HorovodAllreduce:  # noqa: ARG001
    """The allreduce `bench allreduce` times alone (Horovod's ranks are its own: no process group to choose)."""
    return HorovodAllreduce(tensors)


class SyntheticStep:
    """A fixed amount of single-threaded TensorFlow compute (square matmuls) standing in for a rank's forward and
    backward pass before an MPI algorithm's allreduce, sized to about `target_s` on this core."""

    def __init__(self, target_s: float, size: int = 128) -> None:
        import tensorflow as tf

        one_thread()
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


def after_step(comm: Any, send: Any, recv: Any, tensors: Sequence[int], *, compute_s: float, reps: int,
               warmup: int = 1, batch: int = 1, input_shape: Sequence[int] = (1, 1, 1),
               overlap_s: float = 0.0) -> AllreduceMeasurement:
    """The trainer's `Rank.sum` of `send` (cut into `tensors`) and the loss pair inside the trainer's iteration
    (`HorovodIteration`), whose compute takes about `compute_s` without it, fed a `batch` of `input_shape`
    images each time; with `overlap_s` also its `Rank.sum_each` requests made as compute of about that long
    starts (`AllreduceMeasurement.hidden_share`).  The seconds are the ranks' mean iteration less the same
    iteration without the allreduce (bench/iteration_blocks.py); the sums in `recv` are checked, the
    overlapped requests' and an iteration's."""
    rank = trainer_rank(comm.Get_size())
    iteration = HorovodIteration(rank, send, tensors, compute_s, batch=batch, input_shape=input_shape,
                                 seed=comm.Get_rank(), window_s=overlap_s, comm=comm)
    pairs = [(iteration.with_allreduce, iteration.without_allreduce)]
    if overlap_s > 0:
        pairs.append((iteration.overlapped_allreduce, iteration.window_alone))
    costs = alternating_blocks(comm, pairs, reps, warmup)
    if overlap_s > 0:
        iteration.copy_requests_result(recv)
        check_sum(TENSORFLOW.algorithm, comm.Get_size(), recv)
    iteration.copy_result(recv)
    check_sum(TENSORFLOW.algorithm, comm.Get_size(), recv)
    (seconds, steps), *beside = costs
    overlapped, windows = beside[0] if beside else ([], [])
    return AllreduceMeasurement(TENSORFLOW.algorithm, comm.Get_size(), len(send) * 4, seconds,
                                statistics.median(steps), len(tensors), overlapped_seconds=overlapped,
                                window_s=statistics.median(windows) if windows else 0.0)


class StandInNet:
    """The net the probe's iteration trains: stand-in parameters shaped as the probe's tensors, every one learnt,
    and for its loss and gradients a chain of square matmuls (single-threaded, standing in for the forward and
    backward pass) whose gradients are this rank's `send`, cut into `sizes`, whatever the chain computed."""

    def __init__(self, send: Any, sizes: Sequence[int], size: int = 128) -> None:
        import numpy as np
        import tensorflow as tf

        self.gradients = [tf.constant(p) for p in np.split(send, np.cumsum(sizes)[:-1])]
        self.params = [tf.Variable(tf.zeros_like(g)) for g in self.gradients]
        self.learnt = [True] * len(self.params)
        # a variable, not a constant: Grappler would fold matmuls of a constant when it optimises the graph
        self._a = tf.Variable(tf.random.stateless_uniform((size, size), seed=(1, 2)))

    def compute(self, matmuls: int) -> Compute:
        """The loss and gradients of a micro-batch after `matmuls` matmuls (trace_iteration's `compute`)."""
        import tensorflow as tf

        def loss_and_gradients(images: Any, labels: Any, dropout_seed: Any) -> tuple[Any, list[Any]]:  # noqa: ARG001
            # The compute depends on the batch and the gradients on the compute; both terms are 0 (the images
            # and the matmuls are >= 0), which Grappler cannot know: it drops a product with 0.0, and the
            # matmuls with it.
            x = self._a + tf.minimum(tf.reduce_sum(images), 0.0)
            for _ in range(matmuls):
                x = tf.linalg.matmul(x, self._a) * 1e-3
            after = tf.minimum(tf.reduce_sum(x), 0.0)
            return after + tf.cast(tf.size(labels), tf.float32), [g + after for g in self.gradients]
        return loss_and_gradients


def _kept_apart(tensors: list[Any]) -> list[Any]:
    """The sum left out: each rank's own tensors, copied (a sum's result is a new tensor too)."""
    import tensorflow as tf

    return [tf.identity(t) for t in tensors]


class HorovodIteration:
    """The trainer's iteration itself (train/tensorflow/steps.py `trace_iteration`, which `make_train_steps`
    traces for training) around the trainer's `Rank.sum`, with a `StandInNet`'s matmuls for the net's forward and
    backward pass and a real `CaffeSolver`: on the host, a batch of images and labels and the step's scalars
    become the arguments of one concrete function, which computes, sums the gradients and the loss pair over the
    ranks and updates the stand-in parameters; and its twin with the sum left out, which times the rest.  One
    tensor (no `tensors`) is summed as a one-blob net's gradient is, with the loss pair.

    The trainer's allreduce waits inside its one graph call for Horovod's next negotiation cycle
    (model/cycle.py), and where in the cycle its request falls depends on what the rank's core does
    between requests: an allreduce called apart, after a step computed outside the graph, paid more than the
    trainer's, and the same graph called without the host's work in between paid most of a cycle where the
    trainer paid almost none (docs/benchmarks/2026-11-25-xeon-cycle.md, "Why the probe runs the trainer's
    iteration").  The matmul count is sized so that the iteration without the allreduce takes about `target_s`
    here, the same count on every rank (`comm`: the ranks time their matmuls together and agree on one cost).

    The solver is Caffe's SGD without momentum or weight decay (the same ops as with momentum, less the decay
    term), fed a rate of 1 and an effective batch of 1: its history after an iteration is that iteration's
    summed gradients, bit for bit, which `copy_result` reads to check the sum.
    """

    def __init__(self, rank: Any, send: Any, tensors: Sequence[int], target_s: float, *, batch: int = 1,
                 input_shape: Sequence[int] = (1, 1, 1), size: int = 128, seed: int = 0,
                 window_s: float = 0.0, comm: Any = None) -> None:
        import numpy as np

        from firescale.caffe.solver import SolverConfig
        from firescale.train.tensorflow.solvers import CaffeSolver

        self._rank, self._image_shape = rank, tuple(input_shape)
        self.net = StandInNet(send, list(tensors) or [len(send)], size)
        self.solver = CaffeSolver(SolverConfig(type="SGD"), self.net.params,
                                  [f"blob{i}" for i in range(len(self.net.params))])
        rng = np.random.default_rng(seed)
        self._batches = [(rng.random((batch, *input_shape), dtype=np.float32),
                          rng.integers(0, 10, batch, dtype=np.int64)) for _ in range(4)]
        self._calls = 0
        self.loss_and_flag: Any = None
        self._requested: Any = None
        probe_matmuls = 32
        mine = self._sizing(self._trace(0, reduce=False), self._trace(probe_matmuls, reduce=False), probe_matmuls, comm)
        peers = comm.allgather(mine) if comm is not None else [mine]   # (base, per matmul) of every rank
        base = statistics.median(b for b, _ in peers)
        per = agreed_matmul_seconds([e for _, e in peers], floor_s=2 * size ** 3 / MATMUL_PEAK_FLOPS)
        self.matmuls = max(0, round((target_s - base) / per))
        self._with, self._without = self._trace(self.matmuls), self._trace(self.matmuls, reduce=False)
        # the compute an overlapped allreduce can hide behind (backward), sized as the step is
        self._window = self._trace(max(0, round((window_s - base) / per)), reduce=False) if window_s > 0 else None
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

    def _trace(self, matmuls: int, *, reduce: bool = True) -> Any:
        """The trainer's iteration for `matmuls` matmuls of compute, summing over the ranks with the rank's
        `Rank.sum` (`reduce`) or not at all."""
        from firescale.train.tensorflow.steps import trace_iteration

        return trace_iteration(self.net, self.solver, self._image_shape, self.net.compute(matmuls),
                               self._rank.sum if reduce else _kept_apart)

    def _trace_requests(self) -> Any:
        """The allreduce alone, one request a tensor (the loss pair too), as the trainer's overlapped mode
        makes them (`Rank.sum_each`)."""
        import tensorflow as tf

        def requests(flag: Any) -> Any:
            return self._rank.sum_each([*map(tf.identity, self.net.gradients), tf.stack([flag, flag])])
        return tf.function(requests, autograph=False).get_concrete_function(tf.TensorSpec((), tf.float32))

    def _call(self, fn: Any) -> Any:
        """One iteration as the trainer makes it: the step's scalars and seed made on the host, the batch
        passed as arrays (the rate and effective batch 1: the class's docstring says why)."""
        import tensorflow as tf

        self._calls += 1
        images, labels = self._batches[self._calls % len(self._batches)]
        return fn(images, labels, tf.constant([1, self._calls], tf.int64), tf.constant(1.0),
                  tf.constant(self._calls, tf.int64), tf.constant(1.0), tf.constant(0.0))

    def with_allreduce(self) -> None:
        self.loss_and_flag = self._call(self._with)

    def without_allreduce(self) -> None:
        self._call(self._without)

    def window_alone(self) -> None:
        self._call(self._window)

    def overlapped_allreduce(self) -> None:
        """The allreduce's requests made as the window's compute starts (the iteration without the allreduce,
        sized to `window_s`), and that compute beside them.  The requests are a graph call of their own on a
        second Python thread.  Made inside one graph, TensorFlow's single inter-op thread ran the matmul
        chain on and held them until it ended in some calls and not in others, which measured its scheduling
        rather than the link (docs/benchmarks/2026-11-26-xeon-shaped-link.md, "Tried and dropped").  The second
        thread is given 0.2 ms to enter its call, counted in the time."""
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
        self._requested = made["sums"]

    def copy_result(self, recv: Any) -> None:
        """The summed gradients of one more iteration with the allreduce into `recv`, read from the solver's
        history (every rank calls it together, after the timed calls)."""
        import numpy as np

        self.with_allreduce()
        np.copyto(recv, np.concatenate([h.numpy().ravel() for h in self.solver.history]))

    def copy_requests_result(self, recv: Any) -> None:
        """The last overlapped requests' sums into `recv` (the loss pair left out)."""
        import numpy as np

        np.copyto(recv, np.concatenate([t.numpy() for t in self._requested[:-1]]))
