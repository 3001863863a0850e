"""The Horovod data-parallel training loop: Caffe solver numerics, evaluation, snapshots, time-to-accuracy."""
from __future__ import annotations

import collections
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FirescaleError
from ..results import EvalPoint, Segment, TrainResult, baseline_top1, write_result
from .checkpoint import (Snapshot, check_same_trajectory, latest_snapshot, read_snapshot, trajectory_digest,
                         trajectory_settings, write_snapshot)
from .lr_policies import learning_rate
from .scaling import plan_batches
from .solver_config import SolverConfig, load_solver
from .timing import SegmentClock, SplitSums, now, time_to_accuracy

EXIT_INTERRUPTED = 143  # 128 + SIGTERM, also used for SIGUSR1: "snapshot written, resubmit with --resume"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass
class TrainOptions:
    """The `firescale train` command line, resolved."""

    dataset: Path
    net: str
    solver: Path
    out: Path
    overrides: list[str] = field(default_factory=list)
    batch_per_rank: int | None = None
    total_batch: int | None = None
    reference_batch: int | None = None
    lr_scaling: str = "none"
    warmup_iters: int = 0
    target: float | None = None
    target_from: Path | None = None
    tolerance: float = 0.01
    resume: bool = False
    seed: int | None = None
    eval_batch: int = 256
    profile_layers: bool = False
    data_format: str | None = None
    scale: float = 1 / 255
    mean: tuple[float, ...] | str | None = None
    crop: int | None = None
    mirror: bool = False
    threads: int = 1
    command: list[str] = field(default_factory=list)


class StopRequest:
    """Remembers a SIGTERM/SIGUSR1; the loop agrees on it across ranks at the next allreduce."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signum = signum


def _say(rank: Any, text: str) -> None:
    if rank.is_root:
        print(text, flush=True)


def _resolve_target(opts: TrainOptions) -> tuple[float | None, str]:
    if opts.target is not None and opts.target_from is not None:
        raise FirescaleError("give either --target or --target-from, not both")
    if opts.target is not None:
        if not 0 < opts.target <= 1:
            raise FirescaleError(f"--target is a top-1 accuracy in (0, 1], not {opts.target}")
        return opts.target, f"--target {opts.target}"
    if opts.target_from is not None:
        base = baseline_top1(opts.target_from)
        return base - opts.tolerance, f"baseline {opts.target_from} top1 {base:.6f} - tolerance {opts.tolerance}"
    return None, "none (train to max_iter)"


def _seed(opts: TrainOptions, solver: SolverConfig) -> int:
    if opts.seed is not None:
        return opts.seed
    return solver.random_seed if solver.random_seed >= 0 else 1


def run_training(opts: TrainOptions) -> int:
    """Train as one of N Horovod ranks; returns 0 when done, EXIT_INTERRUPTED after a signal snapshot."""
    stop = StopRequest()
    stop.install()
    try:
        return _run(opts, stop)
    finally:
        stop.restore()


def _run(opts: TrainOptions, stop: StopRequest) -> int:  # noqa: C901 - the loop reads best in one place
    clock = SegmentClock()
    solver_cfg = load_solver(opts.solver, opts.overrides)  # bad solver files fail before MPI starts
    target, target_source = _resolve_target(opts)
    from .distributed import describe_allreduce, init_rank, versions

    rank = init_rank(opts.threads)
    import tensorflow as tf

    from ..data.readers import Transform, open_dataset, test_batches, train_batches
    from ..data.transforms import BatchTransformer
    from ..netspec import get_net
    from .evaluation import evaluate, make_eval_step
    from .mllog import RunLog
    from .nets import build_net
    from .solvers import CaffeSolver

    seed = _seed(opts, solver_cfg)
    if opts.eval_batch < rank.size:
        raise FirescaleError(f"--eval-batch {opts.eval_batch} must be at least the {rank.size} ranks")
    plan = plan_batches(rank.size, batch_per_rank=opts.batch_per_rank, total_batch=opts.total_batch,
                        iter_size=solver_cfg.iter_size, reference_batch=opts.reference_batch,
                        lr_scaling=opts.lr_scaling, warmup_iters=opts.warmup_iters)
    tf.random.set_seed(seed)

    transform = Transform(scale=opts.scale, mean=opts.mean, crop=opts.crop, mirror=opts.mirror)
    train_ds = open_dataset(opts.dataset, "train", opts.data_format)
    test_ds = open_dataset(opts.dataset, "test", opts.data_format)
    image_shape = tuple(BatchTransformer(transform, train_ds.shape).out_shape)
    spec = get_net(opts.net, num_classes=train_ds.num_classes, input_shape=image_shape)
    net = build_net(spec, seed)
    names = [info.name for info in net.infos]
    lr_mults = [solver_cfg.lr_mult.get(i.layer, [1.0, 1.0])[0 if i.blob == "weights" else 1] for i in net.infos]
    decay_mults = [solver_cfg.decay_mult.get(i.layer, [1.0, 1.0])[0 if i.blob == "weights" else 1] for i in net.infos]
    for key, table in (("lr_mult", solver_cfg.lr_mult), ("decay_mult", solver_cfg.decay_mult)):
        unknown = sorted(set(table) - {i.layer for i in net.infos})
        if unknown:
            raise FirescaleError(f"{opts.solver}: solver key '{key}.{unknown[0]}' names no layer with "
                                 f"parameters in net {spec.name!r}")
    solver = CaffeSolver(solver_cfg, net.params, names, lr_mults, decay_mults)

    out = Path(opts.out)
    snap_dir = out / "snapshots"
    if rank.is_root:
        snap_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(out / "mllog.txt", enabled=rank.is_root)
    c = log.constants
    log.start(c.INIT_START)

    # ---------------------------------------------------------------- resume or start
    trajectory = trajectory_settings(net=spec.name, dataset_sha256=train_ds.manifest_sha256 or "", seed=seed,
                                     solver=solver_cfg.to_dict(), batch=plan.to_dict(), transform=vars(transform),
                                     target_top1=target)
    meta: dict[str, Any] = {}
    start_iter = 0
    snapshot_file = latest_snapshot(snap_dir, solver_cfg.snapshot_prefix) if (opts.resume and rank.is_root) else None
    snapshot_name = rank.broadcast_object(str(snapshot_file) if snapshot_file else "")
    if snapshot_name:
        if rank.is_root:
            snap = read_snapshot(snapshot_name)
            check_same_trajectory(snap.meta, trajectory, snapshot_name)
            for var, info in zip(net.params, net.infos):
                var.assign(snap.weights[info.name])
            solver.load_state_arrays(snap.solver_state)
            meta = snap.meta
        meta = rank.broadcast_object(meta)
        start_iter = int(meta["iteration"])
        seed = int(meta["seed"])
    rank.broadcast_variables(net.params + solver.history + solver.update_history)

    prior_segments = [Segment(**s) for s in meta.get("segments", [])]
    evals = [EvalPoint(**e) for e in meta.get("evals", [])]
    split_total = SplitSums(**meta["split_sums"]) if "split_sums" in meta else SplitSums()
    clock.prior_train_s = sum(s.train_s for s in prior_segments)
    data_seed = seed
    start_sample = start_iter * plan.effective_batch

    train_stream = iter(train_batches(train_ds, transform, seed=data_seed, rank=rank.rank, size=rank.size,
                                      batch_per_rank=plan.batch_per_rank, start_sample=start_sample))
    eval_per_rank = opts.eval_batch // rank.size

    # ---------------------------------------------------------------- traced steps
    x_spec = tf.TensorSpec((None, *image_shape), tf.float32)
    y_spec = tf.TensorSpec((None,), tf.int64)

    @tf.function(input_signature=[x_spec, y_spec, tf.TensorSpec((2,), tf.int64)])
    def grad_step(images: tf.Tensor, labels: tf.Tensor, dropout_seed: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            logits = net(images, training=True, dropout_seed=dropout_seed)
            loss_sum = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return loss_sum, tape.gradient(loss_sum, net.params)

    grad_specs = [tf.TensorSpec(p.shape, tf.float32) for p in net.params]

    @tf.function(input_signature=[grad_specs, tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.int64)])
    def apply_step(summed: list[tf.Tensor], rate: tf.Tensor, iteration: tf.Tensor) -> None:
        scale = tf.constant(float(plan.effective_batch), tf.float32)
        solver.apply([g / scale for g in summed], rate, iteration)

    eval_step = make_eval_step(net, spec.num_classes, image_shape)
    apply_step.get_concrete_function()
    # Run the forward/backward and evaluation graphs once on zeros, before the clock: TensorFlow
    # optimises a graph and sets up its kernels on its first execution, not when tracing it.  Neither
    # touches the weights, the solver's history or the data stream; apply_step would, so it is traced only.
    zeros = tf.zeros((plan.batch_per_rank, *image_shape), tf.float32)
    no_labels = tf.zeros((plan.batch_per_rank,), tf.int64)
    grad_step(zeros, no_labels, tf.constant([seed, 0], tf.int64))[0].numpy()
    eval_step(zeros, no_labels).numpy()
    rank.sum([tf.zeros_like(p) for p in net.params] + [tf.zeros(2)])  # negotiate Horovod's first allreduce

    hostnames = rank.gather_object(socket.gethostname())
    run_versions = versions(rank.hvd) if rank.is_root else {}
    gradient_bytes = sum(p.shape.num_elements() * p.dtype.size for p in net.params)
    allreduce_info = describe_allreduce(rank, gradient_bytes=gradient_bytes)
    num_train = train_ds.num_records

    for key, value in ((c.GLOBAL_BATCH_SIZE, plan.effective_batch), (c.OPT_NAME, solver_cfg.type),
                       (c.OPT_BASE_LR, solver_cfg.base_lr * plan.lr_scale), (c.OPT_WEIGHT_DECAY, solver_cfg.weight_decay),
                       (c.OPT_LR_WARMUP_STEPS, plan.warmup_iters), (c.SEED, seed), (c.TRAIN_SAMPLES, num_train),
                       (c.EVAL_SAMPLES, test_ds.num_records)):
        log.event(key, value)
    log.end(c.INIT_STOP)
    _say(rank, f"firescale train: {spec.name} on {opts.dataset} ({num_train} train, {test_ds.num_records} test), "
               f"{rank.size} ranks x batch {plan.batch_per_rank} (x iter_size {plan.iter_size}) = "
               f"{plan.effective_batch}, {solver_cfg.type} base_lr {solver_cfg.base_lr} x {plan.lr_scale:g}, "
               f"allreduce {allreduce_info['algorithm']}, target {target_source}"
               + (f", resumed at iteration {start_iter}" if start_iter else ""))

    # ---------------------------------------------------------------- state helpers
    split = SplitSums()
    images_done = 0
    status = "running"

    def current_segment(final_status: str) -> Segment:
        return Segment(start_iter=start_iter, end_iter=iteration, startup_s=clock.startup_s,
                       train_s=clock.segment_s(), eval_s=clock.eval_s, images=images_done,
                       status=final_status, hostnames=hostnames)

    def totals() -> SplitSums:
        return SplitSums(split_total.data_wait_s + split.data_wait_s, split_total.compute_s + split.compute_s,
                         split_total.allreduce_s + split.allreduce_s, split_total.iterations + split.iterations)

    def make_result(final_status: str) -> TrainResult:
        segments = prior_segments + [current_segment(final_status)]
        train_s = sum(s.train_s for s in segments)
        compute_time = sum(s.train_s - s.eval_s for s in segments)
        tta = time_to_accuracy(evals, target)
        return TrainResult(
            net=spec.name, dataset=str(opts.dataset), dataset_manifest_sha256=train_ds.manifest_sha256 or "",
            ranks=rank.size, solver=solver_cfg.to_dict(), batch=plan.to_dict(), seed=seed, data_seed=data_seed,
            target_top1=target, target_source=target_source, reached_target=tta is not None,
            time_to_accuracy_s=tta, train_time_s=train_s, iterations=iteration,
            epochs=iteration * plan.effective_batch / num_train,
            images_per_s=sum(s.images for s in segments) / compute_time if compute_time > 0 else 0.0,
            per_iteration=totals().mean(), allreduce=allreduce_info, hostnames=hostnames, versions=run_versions,
            evals=list(evals), segments=segments, status=final_status, command=list(opts.command))

    def snapshot(final_status: str) -> None:
        if not rank.is_root:
            return
        seg = current_segment(final_status)
        meta_out = {
            "net": spec.name, "dataset_manifest_sha256": train_ds.manifest_sha256 or "", "solver_type": solver_cfg.type,
            "seed": seed, "data_seed": data_seed, "start_sample": iteration * plan.effective_batch,
            "dropout_seed": seed, "ranks": rank.size, "batch": plan.to_dict(),
            "evals": [e.__dict__ for e in evals], "segments": [s.__dict__ for s in prior_segments + [seg]],
            "split_sums": totals().to_dict(),
            "trajectory": trajectory, "trajectory_sha256": trajectory_digest(trajectory),
        }
        weights = {info.name: var.numpy() for info, var in zip(net.infos, net.params)}
        write_snapshot(snap_dir, solver_cfg.snapshot_prefix,
                       Snapshot(iteration, weights, solver.state_arrays(), meta_out))

    def run_eval() -> EvalPoint:
        t0 = now()
        log.start(c.EVAL_START, metadata={"epoch_num": iteration * plan.effective_batch / num_train})
        batches = test_batches(test_ds, transform, rank=rank.rank, size=rank.size, batch=eval_per_rank)
        sums = evaluate(eval_step, batches, rank.sum_numbers, solver_cfg.test_iter)
        clock.eval_s += now() - t0
        point = EvalPoint(iter=iteration, epoch=iteration * plan.effective_batch / num_train,
                          wall_s=clock.run_s(), top1=sums.top1, top5=sums.top5, loss=sums.loss)
        evals.append(point)
        log.event(c.EVAL_ACCURACY, point.top1, metadata={"epoch_num": point.epoch, "iteration": iteration,
                                                        "top5": point.top5, "loss": point.loss})
        log.end(c.EVAL_STOP, metadata={"epoch_num": point.epoch})
        _say(rank, f"eval iter {iteration}: top1 {point.top1:.4f} top5 {point.top5:.4f} loss {point.loss:.4f} "
                   f"({int(sums.count)} images, run time {point.wall_s:.2f} s)")
        if rank.is_root:
            write_result(out / "result.json", make_result("running"))
        return point

    # ---------------------------------------------------------------- the loop
    iteration = start_iter
    losses: collections.deque[float] = collections.deque(maxlen=solver_cfg.average_loss)
    reached = time_to_accuracy(evals, target) is not None
    clock.start_training()
    log.start(c.RUN_START, metadata={"segment": len(prior_segments), "start_iteration": start_iter})
    if solver_cfg.test_initialization and iteration == 0 and not evals:
        top1 = run_eval().top1
        reached = target is not None and top1 >= target
    speed_window = (now(), iteration)
    while iteration < solver_cfg.max_iter and not reached:
        rate = learning_rate(solver_cfg, iteration) * plan.lr_scale * plan.warmup_factor(iteration)
        data_wait = compute = 0.0
        summed: list[Any] | None = None
        loss_sum = tf.constant(0.0)
        for k in range(plan.iter_size):
            t0 = now()
            images, labels = next(train_stream)
            t1 = now()
            micro = (iteration * plan.iter_size + k) * rank.size + rank.rank
            loss_k, grads = grad_step(images, labels, tf.constant([seed, micro], tf.int64))
            summed = list(grads) if summed is None else [a + b for a, b in zip(summed, grads)]
            loss_sum = loss_sum + loss_k
            _ = loss_sum.numpy()
            data_wait += t1 - t0
            compute += now() - t1
        assert summed is not None
        t2 = now()
        flag = 1.0 if stop.signum is not None else 0.0
        reduced = rank.sum(summed + [tf.stack([loss_sum, tf.constant(flag)])])
        loss_and_flag = reduced[-1].numpy()
        t3 = now()
        apply_step(reduced[:-1], tf.constant(rate, tf.float32), tf.constant(iteration, tf.int64))
        t4 = now()
        split.add(data_wait, compute + (t4 - t3), t3 - t2)
        iteration += 1
        images_done += plan.effective_batch
        losses.append(float(loss_and_flag[0]) / plan.effective_batch)
        if not np.isfinite(losses[-1]):
            raise FirescaleError(f"the training loss became {losses[-1]} at iteration {iteration}; "
                                 "lower base_lr (solver key 'base_lr')")
        if solver_cfg.display and iteration % solver_cfg.display == 0:
            t_prev, it_prev = speed_window
            speed = (iteration - it_prev) * plan.effective_batch / max(now() - t_prev, 1e-9)
            speed_window = (now(), iteration)
            _say(rank, f"iter {iteration}/{solver_cfg.max_iter} loss {np.mean(losses):.4f} lr {rate:.6g} "
                       f"{speed:.0f} img/s data {1e3 * data_wait:.2f} ms compute {1e3 * (compute + t4 - t3):.2f} ms "
                       f"allreduce {1e3 * (t3 - t2):.2f} ms")
        if loss_and_flag[1] > 0:  # some rank was told to stop: all stop here, after the same update
            snapshot("interrupted")
            status = "interrupted"
            break
        if solver_cfg.snapshot and iteration % solver_cfg.snapshot == 0:
            snapshot("running")
        if (solver_cfg.test_interval and iteration % solver_cfg.test_interval == 0) or iteration == solver_cfg.max_iter:
            top1 = run_eval().top1
            reached = target is not None and top1 >= target

    if status != "interrupted":
        status = "target_reached" if reached else "finished"
        if solver_cfg.snapshot_after_train:
            snapshot(status)
    result = make_result(status)
    if opts.profile_layers and status != "interrupted":
        from ..perf.traces import write_trace
        from .profile import profile_net

        images, labels = next(train_stream)
        trace = profile_net(net, images, labels, rank, data_wait_s=totals().mean().data_wait_s)
        if rank.is_root:
            write_trace(out / "layers.json", trace)
        result.layer_trace = "layers.json"
        _say(rank, f"layer trace: {len(trace)} layers written to {out / 'layers.json'}")
    if rank.is_root:
        write_result(out / "result.json", result)
    success = status == "target_reached" or (status == "finished" and target is None)
    log.end(c.RUN_STOP, metadata={"status": c.SUCCESS if success else c.ABORTED,
                                  "stopped_by": status, "iteration": iteration})
    log.close()
    rank.barrier()
    if status == "interrupted":
        signame = signal.Signals(stop.signum).name if stop.signum else "a signal on another rank"
        _say(rank, f"stopped by {signame} at iteration {iteration}; snapshot written, resume with --resume")
        sys.stdout.flush()
        return EXIT_INTERRUPTED
    tta = result.time_to_accuracy_s
    _say(rank, f"done: {status} at iteration {iteration}, time to accuracy "
               + (f"{tta:.2f} s" if tta is not None else "not reached")
               + f", {result.images_per_s:.0f} images/s")
    return 0
