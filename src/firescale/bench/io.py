"""`firescale bench io`: reader throughput against a raw sequential read, and data wait per training step.

For each format the same file is read three ways: raw (sequential 4 MiB reads of the whole file into
one buffer, repeated), and through the reader in training order (one rank's shuffled batches) and in
record order, each batch into one reused array as the training feed does.  Rates are records/s and
MB/s; a reader's `fraction_of_raw` compares records/s, i.e. the same file bytes per record.  The raw
read only copies bytes; a reader also checks each record and, for LMDB, interleaves Caffe's CHW planes
into HWC: `pixels_kernel` records whether the compiled kernel ("c") or numpy's fallback did that, since
the fallback is several times slower.  The data wait is measured on the trainer's own feed on a rank
with more than one core (a reader thread reading and transforming batches into a queue, as deep as
prefetch_depth) feeding a synthetic compute step, a TensorFlow matmul loop sized to take at least
twice the feed's time per batch (read and transform, timed inline first) and at least 50 ms: the
fraction of step time spent blocked on the next batch, next to the floor of the same loop fed one
constant batch through the same queue (the hand-off's own cost).  All reads are warm (page cache),
since this measures the reader, not the file system (each measurement starts right after a raw pass
over the file); run it on the shared file system for that.  `open_s` is the time open_dataset takes,
warm: for LMDB mostly the walk that checks data.mdb's tree with plain reads before LMDB maps it.
"""
from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from firescale.caffe.pixels import PIXELS_KERNEL
from firescale.data.manifest import load_manifest, split_files
from firescale.data.prefetch import PrefetchedBatches
from firescale.data.readers import Transform, iter_train_arrays, open_dataset, prefetch_depth
from firescale.data.shard import EpochOrders
from firescale.errors import FirescaleError

READER_TARGET = 0.8
WAIT_TARGET = 0.02


def raw_read(path: Path, seconds: float, block: int = 4 << 20) -> dict:
    """Sequential reads of the whole file until `seconds` pass: passes, bytes, time."""
    size = path.stat().st_size
    buf = bytearray(block)
    passes = 0
    start = time.perf_counter()
    while True:
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
        passes += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return {"passes": passes, "bytes": passes * size, "seconds": elapsed}


def reader_rate(ds, batch: int, seconds: float, shuffled: bool) -> dict:
    """Records read through ds.read in batches for `seconds`: records and time.

    As in the training feed (readers.iter_train_arrays), every batch is read into the same array.
    """
    orders = EpochOrders(ds.num_records, seed=0)
    out = np.empty((batch, *ds.shape), ds.dtype)
    position = 0
    records = 0
    start = time.perf_counter()
    while True:
        positions = np.arange(position, position + batch, dtype=np.int64)
        indices = orders.records_at(positions) if shuffled else positions % ds.num_records
        ds.read(indices, out=out)
        records += batch
        position += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return {"records": records, "seconds": elapsed}


def _rates(records: float, seconds: float, bytes_per_record: float) -> dict:
    return {"records_per_s": records / seconds, "MB_per_s": records * bytes_per_record / seconds / 1e6}


def calibrate_compute(target_s: float):
    """A TensorFlow step (repeated 256x256 matmuls) that takes about `target_s` seconds, and its time."""
    import tensorflow as tf

    a = tf.random.normal((256, 256))

    def make(reps: int):
        @tf.function
        def step(images):
            x = a
            for _ in range(reps):
                x = tf.tanh(tf.matmul(x, a) * 0.01)
            return tf.reduce_sum(x) + tf.reduce_sum(images) * 0.0
        return step

    reps = 4
    while True:
        step = make(reps)
        dummy = tf.zeros((1, 1, 1, 1))
        step(dummy)
        t0 = time.perf_counter()
        for _ in range(5):
            step(dummy).numpy()
        took = (time.perf_counter() - t0) / 5
        if took >= target_s or reps >= 4096:
            return step, took, reps
        reps = max(reps + 1, int(reps * min(8.0, 1.2 * target_s / max(took, 1e-6))))


def _timed_steps(it, step, seconds: float, min_steps: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Run steps pulling from `it`: per step, the seconds blocked in next() and the whole step's seconds."""
    waits: list[float] = []
    totals: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(waits) < min_steps:
        t0 = time.perf_counter()
        images, _ = next(it)
        t1 = time.perf_counter()
        step(images).numpy()
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        totals.append(t2 - t0)
    return np.asarray(waits, dtype=np.float64), np.asarray(totals, dtype=np.float64)


def _feed_s_per_batch(ds, batch: int, batches: int = 5) -> tuple[float, tuple[np.ndarray, np.ndarray]]:
    """Seconds per batch of the trainer's batches (read and transform) made inline, and the last batch."""
    arrays = iter_train_arrays(ds, Transform(), seed=0, rank=0, size=1, batch_per_rank=batch)
    item = next(arrays)
    start = time.perf_counter()
    *_, item = itertools.islice(arrays, batches)
    return (time.perf_counter() - start) / batches, item


def data_wait(ds, batch: int, seconds: float, min_compute_s: float = 0.05) -> dict:
    """Fraction of step time blocked on the next batch of the trainer's feed, compute >= 2x its time.

    Also measured: the same loop fed one constant batch through the same queue, the floor that the
    hand-off costs per step with no reading at all.
    """
    feed_s, (images, labels) = _feed_s_per_batch(ds, batch)
    step, compute_s, reps = calibrate_compute(max(2.0 * feed_s, min_compute_s))
    depth = prefetch_depth(batch, images.shape[1:])
    feed = PrefetchedBatches(iter_train_arrays(ds, Transform(), seed=0, rank=0, size=1, batch_per_rank=batch), depth)
    floor = PrefetchedBatches(itertools.repeat((images, labels)), depth)
    try:
        for it in (feed, floor):
            for _ in range(3):  # warm up the queue and the traced step
                step(next(it)[0]).numpy()
        waits, totals = _timed_steps(feed, step, seconds, 10)
        f_waits, f_totals = _timed_steps(floor, step, min(seconds, 1.0), 10)
    finally:
        feed.close()
        floor.close()
    # The mean is the target's measure; the median shows the typical step when other processes
    # share the cores and preempt the reader thread now and then.
    return {"feed": "reader thread and queue (firescale.data.prefetch), as a rank with more than one core reads",
            "steps": len(waits), "compute_s_per_step": compute_s, "matmul_reps": reps,
            "prefetch_batches": depth, "feed_s_per_batch": feed_s, "step_s": float(totals.mean()),
            "wait_s_per_step": float(waits.mean()), "wait_s_max": float(np.max(waits)),
            "wait_fraction": float(waits.sum() / totals.sum()),
            "wait_fraction_median": float(np.median(waits) / np.median(totals)),
            "handoff_floor_wait_s_per_step": float(f_waits.mean()),
            "handoff_floor_wait_fraction": float(f_waits.sum() / f_totals.sum())}


def bench_io(dataset: str | Path, *, batch: int = 256, seconds: float = 3.0, split: str = "train",
             formats: list[str] | None = None, measure_wait: bool = True) -> dict:
    """Measure every format of a dataset folder; the result is JSON-ready."""
    dataset = Path(dataset)
    manifest = load_manifest(dataset)
    formats = formats or manifest["formats"]
    shape = tuple(manifest["shape"])
    record_bytes = int(np.prod(shape))
    out: dict = {"dataset": str(dataset), "split": split, "batch": batch, "seconds": seconds,
                 "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                 "pixels_kernel": PIXELS_KERNEL,
                 "record_shape": list(shape), "record_bytes": record_bytes, "readers": {}, "data_wait": {},
                 "targets": {"reader_fraction_of_raw": READER_TARGET, "wait_fraction": WAIT_TARGET}}
    for fmt in formats:
        if fmt not in manifest["formats"]:
            raise FirescaleError(f"{dataset} has no {fmt} files; it has {', '.join(manifest['formats'])}")
        file = dataset / split_files(split, fmt)
        raw_read(file, 0.0)  # warm, as every measurement here: the open's own work, not the file system's
        open_dataset(dataset, split, fmt=fmt).close()  # and the readers' modules imported
        opened = time.perf_counter()
        ds = open_dataset(dataset, split, fmt=fmt)
        open_s = time.perf_counter() - opened
        try:
            per_record = file.stat().st_size / ds.num_records
            raw = raw_read(file, seconds)
            raw_rates = _rates(raw["bytes"] / per_record, raw["seconds"], per_record)
            entry: dict[str, Any] = {"file": str(file), "file_bytes": file.stat().st_size,
                                     "records": ds.num_records, "open_s": open_s, "raw_sequential": raw_rates}
            for name, shuffled in (("shuffled", True), ("sequential", False)):
                r = reader_rate(ds, batch, seconds, shuffled)
                rates = _rates(r["records"], r["seconds"], per_record)
                rates["payload_MB_per_s"] = r["records"] * record_bytes / r["seconds"] / 1e6
                rates["fraction_of_raw"] = rates["records_per_s"] / raw_rates["records_per_s"]
                entry[name] = rates
            entry["meets_reader_target"] = entry["shuffled"]["fraction_of_raw"] >= READER_TARGET
            out["readers"][fmt] = entry
            if measure_wait:
                raw_read(file, 0.0)  # one pass to bring the file back into the page cache
                wait = data_wait(ds, batch, seconds)
                wait["meets_wait_target"] = wait["wait_fraction"] < WAIT_TARGET
                out["data_wait"][fmt] = wait
        finally:
            ds.close()
    return out
