"""The data-parallel training loop, one framework or the other: Caffe solver numerics, evaluation, snapshots,
time-to-accuracy.  Everything that touches tensors is the backend's (firescale.train.backend)."""
from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from firescale.caffe.dist import DevicePlan
from firescale.caffe.lr_policies import current_step, learning_rate
from firescale.caffe.solver import SolverConfig, ignored_note, load_solver
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, REGISTRY, Framework
from firescale.nets.device_plan import read_layer_plan
from firescale.nets.spec import Shape
from firescale.results import EvalPoint, TrainResult, baseline_top1, file_record, write_result
from firescale.source import source_commit
from firescale.train.backend import Backend, CollectiveGaveUp, load_backend
from firescale.train.checkpoint import (
    Snapshot,
    check_caffe_layout,
    check_same_read_limit,
    check_same_trajectory,
    latest_snapshot,
    read_snapshot,
    trajectory_settings,
    weights_file_record,
    write_snapshot,
)
from firescale.train.heartbeat import Heartbeat
from firescale.train.options import TrainOptions, record_options
from firescale.train.readback import LossReads, StopRequest, read_due
from firescale.train.run_state import RunState
from firescale.train.scaling import plan_schedule
from firescale.train.timing import SegmentClock, now, time_to_accuracy

if TYPE_CHECKING:
    from firescale.train.caffe_weights import CopiedWeights

Rank = Any   # a backend's rank: rank, size, local_rank, local_size, device, pinned_cpus, devices, is_root, the sums

EXIT_INTERRUPTED = 143  # 128 + SIGTERM, also for SIGUSR1 and SIGUSR2: "snapshot written, resubmit with --resume"


def _say(rank: Rank, text: str) -> None:
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
        return base - opts.tolerance, (f"baseline {' '.join(map(str, opts.target_from))} top1 {base:.6f} "
                                       f"- tolerance {opts.tolerance}")
    return None, "none (train to max_iter)"


def _seed(opts: TrainOptions, solver: SolverConfig) -> int:
    if opts.seed is not None:
        return opts.seed
    return solver.random_seed if solver.random_seed >= 0 else 1


def run_training(opts: TrainOptions) -> int:
    """Train as one of N ranks; returns 0 when done, EXIT_INTERRUPTED after a signal snapshot."""
    stop = StopRequest()
    stop.install()
    try:
        clock = SegmentClock()
        solver_cfg = load_solver(opts.solver, opts.overrides)  # bad solver files fail before MPI starts
        if opts.overlap_allreduce and solver_cfg.iter_size != 1:
            raise FirescaleError(f"--overlap-allreduce needs the solver's iter_size to be 1, not {solver_cfg.iter_size}"
                                 ": accumulated micro-batches send their sum once, after the last one")
        target = _resolve_target(opts)
        plan = read_layer_plan(opts.layer_plan) if opts.layer_plan else solver_cfg.dist
        if opts.layer_plan and plan is None:
            raise FirescaleError(f"--layer-plan {opts.layer_plan}: the file has no dist plan")
        _check_backend_options(opts, plan)
        backend = load_backend(opts.framework, opts.precision, opts.process_group)
        rank = set_up_ranks(opts, plan.devices if plan else 1, backend)
        heartbeat = Heartbeat(opts.out, rank.rank, rank.size).start()
        try:
            training = Training(opts, solver_cfg, target, rank, clock, plan, backend, heartbeat=heartbeat)
            training.restore_or_broadcast()
            training.prepare()
            status = training.train(stop)
            code = training.finish(status, stop)
        except BaseException as exc:
            gave_up = None if isinstance(exc, CollectiveGaveUp) else backend.gave_up(exc)
            heartbeat.fail(gave_up or exc)
            if gave_up is not None:
                raise gave_up from None
            raise
        finally:
            backend.close(rank)
        heartbeat.stop("done")
        return code
    finally:
        stop.restore()


def _check_backend_options(opts: TrainOptions, plan: DevicePlan | None) -> None:
    """What the chosen backend does not do yet (the registry says what each does), refused in one sentence."""
    chosen = REGISTRY[opts.framework]

    def able(can: Callable[[Framework], bool]) -> str:
        return " or ".join(f.name for f in REGISTRY.values() if can(f))

    if plan is not None and not chosen.layer_plans:
        splits = able(lambda f: f.layer_plans)
        raise FirescaleError(f"the {opts.solver if opts.layer_plan is None else opts.layer_plan} dist plan splits "
                             f"layers over devices, which the {splits} backend does and the {opts.framework} one "
                             f"does not yet; use framework {splits} for model parallelism")
    if opts.profile_layers and not chosen.profile_layers:
        raise FirescaleError(f"--profile-layers times layers with the {able(lambda f: f.profile_layers)} backend "
                             f"only, not {opts.framework}")


def set_up_ranks(opts: TrainOptions, devices: int = 1, backend: Backend | None = None) -> Any:
    """The backend's ranks initialised (default TensorFlow's), this rank pinned to its device (or its replica's
    `devices`), the framework deterministic.

    With TensorFlow a run of one rank then shuts Horovod down again: it has nothing to sum (`Rank` answers every
    collective of one rank itself), and Horovod's background thread would otherwise wake every cycle on the
    rank's core for the whole run (what that cost: docs/benchmarks/2026-11-23-zen4.md).  The single-GPU
    baseline thus pays for no communication, whatever the site's `horovod:` knobs.  PyTorch's one rank makes
    no process group.
    """
    backend = backend or load_backend(DEFAULT_FRAMEWORK)
    return backend.init_rank(opts.threads, devices)


class Training:
    """One rank's training run, in the steps of the domain: build, restore or broadcast, prepare the traced
    steps, then step, evaluate and snapshot until max_iter, the target or a stop signal, and finish."""

    def __init__(self, opts: TrainOptions, solver_cfg: SolverConfig, target: tuple[float | None, str],
                 rank: Rank, clock: SegmentClock, layer_plan: DevicePlan | None = None,
                 backend: Backend | None = None, *, heartbeat: Heartbeat | None = None) -> None:
        self.opts, self.solver_cfg, self.rank, self.clock = opts, solver_cfg, rank, clock   # clock: the state's
        # where this rank is, for the runner's stall watch (none written unless started: run_training starts it)
        self.heartbeat = heartbeat or Heartbeat(opts.out, rank.rank, rank.size, interval_s=0)
        self.backend = backend or load_backend(opts.framework, opts.precision, opts.process_group)
        self.layer_plan = layer_plan
        self.target, self.target_source = target
        self.seed = _seed(opts, solver_cfg)   # the fillers' (a resumed run's is the same: its trajectory has it)
        if opts.split_every < 1:
            raise FirescaleError(f"--split-every must be at least 1, not {opts.split_every}")
        if opts.eval_batch < rank.size:
            raise FirescaleError(f"--eval-batch {opts.eval_batch} must be at least the {rank.size} ranks")
        from firescale.train.data_layers import first_batch, read_data_layers
        from firescale.train.net_file import choose_net, test_net_path

        self.chosen = choose_net(opts.net, solver_cfg, opts.solver)
        self.test_net = test_net_path(solver_cfg, opts.solver)
        self.data_layers = read_data_layers(self.chosen.name, self.test_net)
        batch_per_rank, total_batch, self.batch_note = first_batch(self.data_layers, opts.batch_per_rank,
                                                                   opts.total_batch, rank.size)
        self.schedule = plan_schedule(rank.size, opts.batch_schedule, batch_per_rank=batch_per_rank,
                                      total_batch=total_batch, iter_size=solver_cfg.iter_size,
                                      reference_batch=opts.reference_batch, lr_scaling=opts.lr_scaling,
                                      warmup_iters=opts.warmup_iters, base_lr=solver_cfg.base_lr,
                                      warmup_start_lr=opts.warmup_start_lr)
        self.plan = self.schedule.plan_at(0)
        self.build()
        self.out = Path(opts.out)
        self.snap_dir = self.out / "snapshots"
        if rank.is_root:
            self.snap_dir.mkdir(parents=True, exist_ok=True)
        from firescale.train.mllog import RunLog

        self.log = RunLog(self.out / "mllog.txt", enabled=rank.is_root)
        self.log.start(self.log.constants.INIT_START)
        self.train_stream: Any = None
        self.state: RunState   # made by restore_or_broadcast, from the settings or from the snapshot resumed
        # what the loop asks every iteration, worked out once: where the batch changes, where the host reads
        self.phase_starts = frozenset(start for start, _ in self.schedule.phases[1:])
        self.read_every = (solver_cfg.display, solver_cfg.snapshot, solver_cfg.test_interval)

    # ------------------------------------------------------------ build
    def build(self) -> None:
        """Open the datasets, build the net from its spec with Caffe's fillers, and its solver."""
        from firescale.data.readers import open_dataset
        from firescale.data.transforms import BatchTransformer
        from firescale.nets.zoo import get_net
        from firescale.train.data_layers import data_transform, test_images
        from firescale.train.net_file import blob_multipliers, check_classes, check_test_net, net_file_settings

        opts, cfg, chosen = self.opts, self.solver_cfg, self.chosen
        self.transform, transform_notes = data_transform(self.data_layers, scale=opts.scale, mean=opts.mean,
                                                         crop=opts.crop, mirror=opts.mirror)
        with self.heartbeat.during("dataset-check"):
            self.train_ds = open_dataset(opts.dataset, "train", opts.data_format)
            self.test_ds = open_dataset(opts.dataset, "test", opts.data_format)
        height, width, channels = BatchTransformer(self.transform, self.train_ds.shape).out_shape
        self.image_shape: Shape = (int(height), int(width), int(channels))
        # A Caffe file keeps its own classes (the dataset's must agree); a built-in net takes the dataset's.
        self.spec = get_net(chosen.name, input_shape=self.image_shape)
        if self.spec.source:
            check_classes(self.spec, self.train_ds.num_classes, opts.dataset)
        else:
            self.spec = get_net(chosen.name, num_classes=self.train_ds.num_classes, input_shape=self.image_shape)
        if self.test_net is not None:
            check_test_net(self.spec, self.test_net)
        self.net_file = net_file_settings(self.spec, self.test_net)
        # hashed at the start, as the trained file is: a test net edited during the run shows in the report
        self.test_net_file = None if self.test_net is None else file_record(self.test_net)
        self.eval_images, eval_note = test_images(cfg.test_iter, self.data_layers, opts.eval_batch,
                                                  self.test_ds.num_records)
        for line in (chosen.note, self.net_file.data if self.net_file else "", self.batch_note, *transform_notes,
                     eval_note):
            if line:
                _say(self.rank, line)
        self.placement = self._place()
        self.net = net = self.backend.build_net(self.spec, self.seed,
                                                self.placement.devices if self.placement else None,
                                                self.net_file.moving_average if self.net_file else None)
        names = [info.name for info in net.infos]
        lr_mults, decay_mults = blob_multipliers(self.spec, net.infos, self.net_file, cfg, opts.solver)
        self.solver = self.backend.make_solver(cfg, net, names, lr_mults, decay_mults)
        check_caffe_layout(self.spec, net.infos)
        # Caffe's weights are read and checked against the net before the run folder is touched.
        self.caffe_weights = self._read_caffe_weights(opts.weights) if opts.weights and self.rank.is_root else None

    def _read_caffe_weights(self, path: Path) -> CopiedWeights:
        from firescale.caffe.caffemodel import read_weights
        from firescale.train.caffe_weights import net_from_caffe

        return net_from_caffe(self.spec, read_weights(path), path)

    def _place(self) -> Any:
        """This replica's layers on its devices, from the plan's arch for this rank (None: one device)."""
        if self.layer_plan is None:
            return None
        from firescale.train.placement import choose_arch, place, with_boundaries

        plan, rank = self.layer_plan, self.rank
        arch = choose_arch(plan, rank.local_rank, rank.local_size)
        for k, test_arch in enumerate(plan.test):  # the test nets' arches must name this net's layers too
            place(plan, self.spec, k, rank.devices, test_arch)
        return with_boundaries(place(plan, self.spec, arch, rank.devices), self.spec, self.plan.batch_per_rank)

    # ------------------------------------------------------------ restore or broadcast
    def restore_or_broadcast(self) -> None:
        """Rank 0 reads the chosen snapshot (--snapshot), or the newest when resuming, or else copies Caffe's
        weights (--weights); every rank then gets rank 0's weights and history, and the run state."""
        import socket

        rank, cfg = self.rank, self.solver_cfg
        opts = self.opts
        weights_record = None
        if opts.weights and rank.is_root:
            weights_record = weights_file_record(Path(opts.weights))
        trajectory = trajectory_settings(
            net=self.spec.name, net_sha256=self.net_file.sha256 if self.net_file else None,
            dataset_sha256=self.train_ds.manifest_sha256 or "", seed=self.seed,
            solver=cfg.to_dict(), batch=self.batch_record(), transform=vars(self.transform), target_top1=self.target,
            weights=rank.broadcast_object(weights_record))
        snapshot_file = None
        if rank.is_root:
            snapshot_file = opts.snapshot if opts.snapshot is not None else (
                latest_snapshot(self.snap_dir, cfg.snapshot_name) if opts.resume else None)
        snapshot_name = rank.broadcast_object(str(snapshot_file) if snapshot_file else "")
        meta = None
        if snapshot_name:
            if rank.is_root:
                meta = self._read_snapshot(snapshot_name, trajectory)
            meta = rank.broadcast_object(meta)
        elif self.caffe_weights is not None:
            self._copy_weights(self.caffe_weights)
        self.backend.broadcast_state(rank, self.net, self.solver)
        hostnames = rank.gather_object(socket.gethostname())
        if meta is None:
            self.state = RunState(
                net=self.spec.name, dataset_manifest_sha256=self.train_ds.manifest_sha256 or "",
                solver_type=cfg.type, ranks=rank.size, batch=self.batch_record(), trajectory=trajectory,
                read_limit_mbs=opts.read_limit_mbs, seed=self.seed, data_seed=self.seed, hostnames=hostnames,
                clock=self.clock)
        else:
            self.state = RunState.from_dict(meta, where=f"snapshot {snapshot_name}", clock=self.clock,
                                            hostnames=hostnames)
            _say(rank, f"resuming from {snapshot_name} at iteration {self.state.start_iter}")

    def _read_snapshot(self, name: str, trajectory: dict[str, Any]) -> dict[str, Any]:
        snap = read_snapshot(name, self.spec)
        check_same_trajectory(snap.meta, trajectory, name)
        check_same_read_limit(snap.meta, self.opts.read_limit_mbs, name)
        self.backend.write_params(self.net, {info.name: snap.weights[info.name] for info in self.net.infos})
        self.solver.load_state_arrays(snap.solver_state)
        return snap.meta

    def _copy_weights(self, copied: CopiedWeights) -> None:
        """Rank 0 copies Caffe's weights into the net by layer name, as Caffe's CopyTrainedLayersFrom: the
        net's layers the file lacks keep their fillers, the file's other layers are ignored; says which."""
        self.backend.write_params(self.net, copied.weights)
        words = [f"weights from {self.opts.weights}: copied {', '.join(copied.copied) or 'no layer'}"]
        if copied.kept:
            words.append(f"not in the file, so kept from their fillers: {', '.join(copied.kept)}")
        if copied.ignored:
            words.append(f"layers of the file not in net {self.spec.name!r}, ignored: {', '.join(copied.ignored)}")
        _say(self.rank, "; ".join(words))

    # ------------------------------------------------------------ prepare
    def prepare(self) -> None:
        """The training stream from the resumed sample, the traced steps warmed up, the run's constants logged."""
        rank, backend = self.rank, self.backend
        self.open_stream()
        self.eval_per_rank = self.opts.eval_batch // rank.size
        self.steps = backend.make_steps(self.net, self.solver, rank, self.image_shape,
                                        overlap=self.opts.overlap_allreduce)
        self.steps.warm_up(self.plan.batch_per_rank, self.state.seed)
        self.run_versions = {**backend.versions(rank), **source_commit()} if rank.is_root else {}
        self.allreduce_info = backend.describe_allreduce(rank, gradient_bytes=backend.gradient_bytes(self.net),
                                                         overlap=self.opts.overlap_allreduce)
        self._log_constants()

    def open_stream(self) -> None:
        """This rank's training batches of the phase at the run's iteration, from the sample it has reached."""
        from firescale.data.batch import batches_per_read
        from firescale.data.prefetch import PrefetchedBatches
        from firescale.data.readers import iter_train_arrays, prefetch_depth
        from firescale.data.shard import rank_positions
        from firescale.data.throttle import limit_reads

        self.plan = self.schedule.plan_at(self.state.iteration)
        start, batch = self.state.samples, self.plan.batch_per_rank
        rank_positions(start, batch * self.rank.size, self.rank.rank, self.rank.size)  # bad positions fail here
        if self.train_stream is not None:
            self.train_stream.close()
        # A read limit sits where the read happens: in the reader thread when prefetching, which may hide it.
        arrays = iter_train_arrays(limit_reads(self.train_ds, self.opts.read_limit_mbs), self.transform,
                                   seed=self.state.data_seed, rank=self.rank.rank, size=self.rank.size,
                                   batch_per_rank=batch, start_sample=start,
                                   batches_per_read=batches_per_read(batch, self.image_shape))
        # A rank pinned to one core reads inline: a reader thread would only take turns with training for
        # the core and the GIL.  Otherwise a reader thread keeps batches ready.
        one_core = len(self.rank.pinned_cpus) == 1
        self.train_stream = arrays if one_core else PrefetchedBatches(arrays, prefetch_depth(batch, self.image_shape))

    def _log_constants(self) -> None:
        log, c, cfg, plan = self.log, self.log.constants, self.solver_cfg, self.plan
        for key, value in ((c.GLOBAL_BATCH_SIZE, plan.effective_batch), (c.OPT_NAME, cfg.type),
                           (c.OPT_BASE_LR, cfg.base_lr * plan.lr_scale), (c.OPT_WEIGHT_DECAY, cfg.weight_decay),
                           (c.OPT_LR_WARMUP_STEPS, plan.warmup_iters), (c.SEED, self.state.seed),
                           (c.TRAIN_SAMPLES, self.train_ds.num_records), (c.EVAL_SAMPLES, self.eval_images)):
            log.event(key, value)
        log.end(c.INIT_STOP)
        if self.placement is not None:
            _say(self.rank, f"layers split over {len(self.rank.devices)} devices: " + ", ".join(
                f"{b.source} -> {b.target} after {b.after} ({b.bytes:,} bytes)" for b in self.placement.boundaries))
        _say(self.rank, f"firescale train: {self.spec.name} on {self.opts.dataset} ({self.train_ds.num_records} train, "
                        f"{self.test_ds.num_records} test), {self.rank.size} ranks x batch {plan.batch_per_rank} "
                        f"(x iter_size {plan.iter_size}) = {plan.effective_batch}, {cfg.type} base_lr {cfg.base_lr} "
                        f"x {plan.lr_scale:g}, allreduce {self.allreduce_info.algorithm}"
                        + (" overlapped with backward" if self.opts.overlap_allreduce else "") + ", "
                        f"target {self.target_source}"
                        + (f", resumed at iteration {self.state.start_iter}" if self.state.start_iter else "")
                        + (f", reads limited to {self.opts.read_limit_mbs:g} MB/s per rank"
                           if self.opts.read_limit_mbs else ""))
        if ignored_note(cfg):
            _say(self.rank, ignored_note(cfg))

    # ------------------------------------------------------------ the loop
    def train(self, stop: StopRequest) -> str:
        """Step until max_iter, the target or a stop signal; evaluate and snapshot on the way; the status."""
        cfg, c, state = self.solver_cfg, self.log.constants, self.state
        self.loss_reads = LossReads(cfg.average_loss, self.steps.host)
        reached = time_to_accuracy(state.evals, self.target) is not None
        # Every rank's clock starts together: a rank still preparing would otherwise be waited for in the first
        # iteration, inside the training time of those that were ready (a bare loop starts its clock so too).
        self.rank.barrier()
        state.clock.start_training()
        self.log.start(c.RUN_START, metadata={"segment": len(state.earlier), "start_iteration": state.start_iter})
        if cfg.test_initialization and state.iteration == 0 and not state.evals:
            reached = self._reached(self.evaluate().top1)
        elif state.iteration and not reached and self._evaluation_due() \
                and not any(e.iter == state.iteration for e in state.evals):
            # The last segment was stopped by the update that made this evaluation due, before it ran.
            reached = self._reached(self.evaluate().top1)
        self.speed_window = (now(), state.iteration)
        self.heartbeat.iteration = state.iteration   # a resumed run's first
        self.heartbeat.enter("train")
        while state.iteration < cfg.max_iter and not reached:
            stop_agreed = self.step(stop)
            if stop_agreed:  # some rank was told to stop: all stop here, after the same update
                self.snapshot("interrupted")
                return "interrupted"
            if cfg.snapshot and state.iteration % cfg.snapshot == 0:
                self.snapshot("running")
            if self._evaluation_due():
                reached = self._reached(self.evaluate().top1)
        status = "target_reached" if reached else "finished"
        if cfg.snapshot_after_train:
            self.snapshot(status)
        return status

    def _evaluation_due(self) -> bool:
        cfg, it = self.solver_cfg, self.state.iteration
        return bool(cfg.test_interval and it % cfg.test_interval == 0) or it == cfg.max_iter

    def _reached(self, top1: float) -> bool:
        return self.target is not None and top1 >= self.target

    def step(self, stop: StopRequest) -> bool:
        """One update: iter_size micro-batches, one allreduce (with the stop flag), the solver; True when the
        ranks agreed to stop, which they learn only where the host reads the summed losses and flags."""
        state = self.state
        it = state.iteration
        if it in self.phase_starts:
            self.open_stream()
            _say(self.rank, f"iter {it}: the batch becomes {self.plan.batch_per_rank} per rank "
                            f"({self.plan.effective_batch} per update), learning rate x {self.plan.lr_scale:g}")
        plan = self.plan
        rate = learning_rate(self.solver_cfg, it) * plan.lr_scale * plan.warmup_factor(it)
        # A rank's flag stays raised from its signal on, so the sum read at any later iteration shows it.
        flag = 1.0 if stop.signum is not None else 0.0
        if plan.iter_size == 1 and it != state.start_iter and it % self.opts.split_every:
            summed = self._whole_iteration(rate, it, plan.effective_batch, flag)
        else:
            summed = self._iteration_in_parts(rate, it, plan.effective_batch, flag)
        state.updated(plan.effective_batch)
        self.heartbeat.updated(state.iteration)
        self.loss_reads.add(summed, plan.effective_batch)
        if not (read_due(state.iteration, self.read_every, self.solver_cfg.max_iter)
                or state.iteration in self.phase_starts):
            return False
        stop_agreed = self.loss_reads.read(state.iteration)
        self._display(rate)
        return stop_agreed

    def _whole_iteration(self, rate: float, iteration: int, batch: int, flag: float) -> Any:
        """The iteration as one call of the backend: gradients, their allreduce with the loss and flag, the update."""
        t0 = now()
        images, labels = self.steps.batch(*next(self.train_stream))
        t1 = now()
        seed = (self.state.seed, iteration * self.rank.size + self.rank.rank)
        summed = self.steps.iteration(images, labels, seed, rate, iteration, batch, flag)
        self.state.split.add_whole(t1 - t0, now() - t1)
        return summed

    def _iteration_in_parts(self, rate: float, iteration: int, batch: int, flag: float) -> Any:
        """The iteration in its parts, the host waiting after each, which times them apart: every micro-batch's
        gradients (summed here), the allreduce of their sum with the loss and flag, the update."""
        plan, rank, steps = self.plan, self.rank, self.steps
        data_wait = compute = 0.0
        summed: list[Any] | None = None
        loss_sum: Any = None
        for k in range(plan.iter_size):
            t0 = now()
            images, labels = steps.batch(*next(self.train_stream))
            t1 = now()
            micro = (iteration * plan.iter_size + k) * rank.size + rank.rank
            loss_k, grads = steps.gradients(images, labels, (self.state.seed, micro))
            if summed is None:      # the first micro-batch as it is: no eager copies or adds per step
                summed, loss_sum = grads, loss_k
            else:
                summed, loss_sum = [a + b for a, b in zip(summed, grads)], loss_sum + loss_k
                steps.host(loss_sum)
            data_wait += t1 - t0
            compute += now() - t1
        assert summed is not None
        t2 = now()
        reduced, loss_and_flag = steps.allreduce(summed, loss_sum, flag)
        t3 = now()
        steps.apply(reduced, rate, iteration, batch)
        self.state.split.add(data_wait, compute + now() - t3, t3 - t2)
        return loss_and_flag

    def _display(self, rate: float) -> None:
        cfg, it = self.solver_cfg, self.state.iteration
        if not (cfg.display and it % cfg.display == 0):
            return
        t_prev, it_prev = self.speed_window
        speed = (it - it_prev) * self.plan.effective_batch / max(now() - t_prev, 1e-9)
        self.speed_window = (now(), it)
        split = self.state.split.mean(self.opts.split_every)
        _say(self.rank, f"iter {it}/{cfg.max_iter} loss {self.loss_reads.average:.4f} lr {rate:.6g} {speed:.0f} img/s "
                        f"data {1e3 * split.data_wait_s:.2f} ms compute {1e3 * split.compute_s:.2f} ms "
                        f"allreduce {1e3 * split.allreduce_s:.2f} ms (means of this segment)")

    # ------------------------------------------------------------ evaluate
    def evaluate(self) -> EvalPoint:
        """The test set's first `eval_images` (all of it without test_iter), sharded over the ranks; logged, printed
        and written to result.json."""
        with self.heartbeat.during("eval"):
            return self._evaluate()

    def _evaluate(self) -> EvalPoint:
        from firescale.data.readers import test_batches
        from firescale.train.evaluation import evaluate, rank_share

        c, state = self.log.constants, self.state
        it = state.iteration
        t0 = now()
        epoch = state.samples / self.train_ds.num_records
        self.log.start(c.EVAL_START, metadata={"epoch_num": epoch})
        # Each rank's BatchNorm statistics follow its own batches (Caffe's multi-GPU does the same); the
        # test uses rank 0's on every rank, as Caffe tests on its root solver's net only.
        self.backend.broadcast_statistics(self.rank, self.net)
        batches = test_batches(self.test_ds, self.transform, rank=self.rank.rank, size=self.rank.size,
                               batch=self.eval_per_rank)
        steps, beat = self.steps, self.heartbeat

        def step(images: Any, labels: Any) -> Any:
            sums = steps.evaluate(*steps.batch(images, labels))
            beat.step()
            return sums

        try:
            sums = evaluate(step, batches,
                            self.rank.sum_numbers, rank_share(self.eval_images, self.rank.rank, self.rank.size))
        finally:
            batches.close()
        took = now() - t0
        point = state.evaluated(epoch, sums.top1, sums.top5, sums.loss, took)
        self.log.event(c.EVAL_ACCURACY, point.top1, metadata={"epoch_num": point.epoch, "iteration": it,
                                                             "top5": point.top5, "loss": point.loss})
        self.log.end(c.EVAL_STOP, metadata={"epoch_num": point.epoch})
        _say(self.rank, f"eval iter {it}: top1 {point.top1:.4f} top5 {point.top5:.4f} loss {point.loss:.4f} "
                        f"({int(sums.count)} images in {took:.2f} s, run time {point.wall_s:.2f} s)")
        if self.rank.is_root:   # the record of the evaluation so far (a run that dies keeps it)
            t1 = now()
            write_result(self.out / "result.json", self.result("running"))
            state.recorded(point, now() - t1)
        return point

    # ------------------------------------------------------------ snapshot and result
    def snapshot(self, status: str) -> None:
        """Rank 0 writes weights, solver history and the run state (data order, evaluations, segments)."""
        if not self.rank.is_root:
            return
        with self.heartbeat.during("snapshot"):
            cfg, it = self.solver_cfg, self.state.iteration
            snap = Snapshot(it, self.backend.read_params(self.net), self.solver.state_arrays(),
                            self.state.to_dict(status))
            write_snapshot(self.snap_dir, cfg.snapshot_name, snap, self.spec, snapshot_format=cfg.snapshot_format,
                           current_step=current_step(cfg, it))

    def batch_record(self) -> dict[str, Any]:
        """The first phase's batch plan, and every phase when the batch changes during the run."""
        first = self.schedule.phases[0][1].to_dict()
        return {**first, "schedule": self.schedule.to_dict()} if len(self.schedule.phases) > 1 else first

    def result(self, status: str) -> TrainResult:
        """The run record so far (all segments, this one ending with `status`)."""
        state = self.state
        segments = state.segments(status)
        compute_time = sum(s.train_s - s.eval_s for s in segments)
        tta = time_to_accuracy(state.evals, self.target)
        return TrainResult(
            net=state.net, dataset=str(self.opts.dataset),
            dataset_manifest_sha256=state.dataset_manifest_sha256, ranks=state.ranks,
            solver=self.solver_cfg.to_dict(), batch=state.batch, seed=state.seed, data_seed=state.data_seed,
            target_top1=self.target, target_source=self.target_source, reached_target=tta is not None,
            time_to_accuracy_s=tta, train_time_s=sum(s.train_s for s in segments), iterations=state.iteration,
            epochs=state.samples / self.train_ds.num_records,
            images_per_s=sum(s.images for s in segments) / compute_time if compute_time > 0 else 0.0,
            per_iteration=state.split_sums().mean(self.opts.split_every), allreduce=self.allreduce_info.to_dict(),
            hostnames=state.hostnames, versions=self.run_versions, evals=list(state.evals), segments=segments,
            status=status,
            command=list(self.opts.command), options=record_options(self.opts),
            read_limit_mbs=state.read_limit_mbs,
            net_file=file_record(self.net_file.source, self.net_file.sha256) if self.net_file else None,
            test_net_file=self.test_net_file)

    # ------------------------------------------------------------ finish
    def finish(self, status: str, stop: StopRequest) -> int:
        """The layer trace when asked, result.json, the closing log lines; the process's exit code."""
        rank, c = self.rank, self.log.constants
        self.heartbeat.enter("finish")
        result = self.result(status)
        if self.opts.profile_layers and status != "interrupted":
            self._profile_layers(result)
        if self.placement is not None:
            self.placement = self.backend.measure_copies(self.placement)
            result.placement = self.placement.to_dict()
        self.train_stream.close()
        if rank.is_root:
            write_result(self.out / "result.json", result)
        success = status == "target_reached" or (status == "finished" and self.target is None)
        self.log.end(c.RUN_STOP, metadata={"status": c.SUCCESS if success else c.ABORTED,
                                           "stopped_by": status, "iteration": self.state.iteration})
        self.log.close()
        rank.barrier()
        if status == "interrupted":
            signame = signal.Signals(stop.signum).name if stop.signum else "a signal on another rank"
            _say(rank, f"stopped by {signame} at iteration {self.state.iteration}; snapshot written, resume with "
                       "--resume")
            sys.stdout.flush()
            return EXIT_INTERRUPTED
        tta = result.time_to_accuracy_s
        _say(rank, f"done: {status} at iteration {self.state.iteration}, time to accuracy "
                   + (f"{tta:.2f} s" if tta is not None else "not reached")
                   + f", {result.images_per_s:.0f} images/s")
        return 0

    def _profile_layers(self, result: TrainResult) -> None:
        from firescale.model.traces import write_trace

        images, labels = self.steps.batch(*next(self.train_stream))
        trace = self.backend.profile_layers(self.net, images, labels, self.rank,
                                            data_wait_s=self.state.split_sums().mean().data_wait_s)
        if self.rank.is_root:
            write_trace(self.out / "layers.json", trace)
        result.layer_trace = "layers.json"
        _say(self.rank, f"layer trace: {len(trace)} layers written to {self.out / 'layers.json'}")
