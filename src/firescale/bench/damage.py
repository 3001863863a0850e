"""Damaged copies of a dataset read through the trainer's readers, each in a child: read, stopped or crashed.

A seeded sweep makes copies of one small dataset folder with one file damaged as a shared filesystem
can damage it (bytes flipped, the file cut short, a 4 KiB page zeroed) and reads each copy through the
training reader (one epoch of shuffled batches) and the test reader, in a forked child with a time
limit.  Four reader paths are damaged in turn: our LMDB and our HDF5 files (through the dataset folder
and its manifest), a bare LMDB directory as Caffe's convert_imageset leaves it, and Caffe's HDF5Data
list of float32 files.  Each copy ends one way:

    read     the child read every batch (damaged pixels read as they are: `data verify` finds those)
    stopped  the child stopped with one sentence (a FirescaleError, one line) naming the damaged file
    unclear  it stopped with a FirescaleError that does not name the file, or takes more than a line
    crashed  a signal (SIGBUS, SIGSEGV, SIGABRT), a Python traceback or any other exit
    hung     the child was still reading when its time ran out (it is then killed)

Only `read` and `stopped` are acceptable; `firescale bench damage` prints the counts and each other
outcome, and the suite runs a bounded sweep (tests/data/test_damaged_datasets.py).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from firescale.errors import FirescaleError

TARGETS = ("lmdb", "hdf5", "caffe-lmdb", "caffe-hdf5")
DAMAGES = ("flip", "truncate", "zero-page")
PAGE = 4096
BATCH = 64
CAFFE_LIST = "caffe_hdf5.txt"
OUTCOMES = ("read", "stopped", "unclear", "crashed", "hung")


@dataclass
class Damage:
    """One damaged copy: which reader path, which file (relative to the copy), what was done to it."""

    target: str
    split: str
    file: str
    kind: str
    detail: str


@dataclass
class Trial:
    """A damaged copy and how its child ended; `message` is the child's last words (or its signal)."""

    damage: Damage
    outcome: str
    message: str
    seconds: float


@dataclass
class SweepResult:
    """Every trial of a sweep and the count per outcome."""

    trials: list[Trial] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(t.outcome for t in self.trials)
        return {name: found.get(name, 0) for name in OUTCOMES}

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.outcome not in ("read", "stopped")]


def write_caffe_hdf5(dataset: Path) -> None:
    """Beside our files, Caffe's HDF5Data layout of each split: two float32 (N, C, H, W) files and a list."""
    import h5py

    from firescale.data.hdf5_io import Hdf5Reader

    for split in ("train", "test"):
        reader = Hdf5Reader(dataset / f"{split}.h5")
        try:
            images, labels = reader.read(np.arange(reader.num_records))
        finally:
            reader.close()
        planar = images.transpose(0, 3, 1, 2).astype(np.float32) / 255
        half = len(planar) // 2
        names = []
        for k, part in enumerate((slice(0, half), slice(half, None))):
            name = f"caffe_{split}_{k}.h5"
            with h5py.File(dataset / name, "w") as f:  # HDF5's defaults, as Caffe's tools write them
                f.create_dataset("data", data=planar[part])
                f.create_dataset("label", data=labels[part].astype(np.float32).reshape(-1, 1))
            names.append(name)
        (dataset / f"{split}_{CAFFE_LIST}").write_text("".join(n + "\n" for n in names))


def target_files(target: str, split: str) -> list[str]:
    """The files of a reader path that a damage may hit (relative to the dataset folder)."""
    if target in ("lmdb", "caffe-lmdb"):
        return [f"{split}.lmdb/data.mdb"]
    if target == "hdf5":
        return [f"{split}.h5"]
    return [f"caffe_{split}_0.h5", f"caffe_{split}_1.h5"]


def damage_file(path: Path, rng: np.random.Generator) -> tuple[str, str]:
    """Damage `path` in place, one of DAMAGES drawn by `rng`; (kind, what exactly)."""
    raw = bytearray(path.read_bytes())
    kind = DAMAGES[int(rng.choice(len(DAMAGES), p=[0.5, 0.25, 0.25]))]
    if kind == "flip":
        where = sorted(int(i) for i in rng.choice(len(raw), size=int(rng.integers(1, 5)), replace=False))
        for i in where:
            raw[i] ^= int(rng.integers(1, 256))
        detail = "bytes " + ", ".join(map(str, where))
    elif kind == "truncate":
        size = int(rng.integers(0, len(raw)))
        del raw[size:]
        detail = f"cut to {size} of {path.stat().st_size} bytes"
    else:
        page = int(rng.integers(0, max(1, len(raw) // PAGE)))
        raw[page * PAGE:(page + 1) * PAGE] = bytes(len(raw[page * PAGE:(page + 1) * PAGE]))
        detail = f"page {page} (bytes {page * PAGE}..{min(len(raw), (page + 1) * PAGE)}) zeroed"
    path.write_bytes(bytes(raw))
    return kind, detail


def read_through(dataset: Path, target: str, split: str) -> int:
    """Open one split of a reader path and read it as training (one epoch) and test do; records read."""
    from firescale.data.readers import Transform, open_dataset, test_batches, train_batches

    if target == "caffe-lmdb":
        ds = open_dataset(dataset / f"{split}.lmdb", split)
    elif target == "caffe-hdf5":
        ds = open_dataset(dataset / f"{split}_{CAFFE_LIST}", split)
    else:
        ds = open_dataset(dataset, split, fmt=target)
    records = 0
    try:
        batches = -(-ds.num_records // BATCH)
        train = train_batches(ds, Transform(), seed=0, rank=0, size=1, batch_per_rank=BATCH)
        try:
            for _ in range(batches):
                records += len(next(train)[1])
        finally:
            getattr(train, "close", lambda: None)()
        test = test_batches(ds, Transform(), rank=0, size=1, batch=BATCH)
        try:
            for _, labels in test:
                records += len(labels)
        finally:
            test.close()
    finally:
        ds.close()
    return records


def _child(work: Callable[[], object], out: int) -> None:
    """In the forked child: run `work`, write one line of outcome to `out`, and leave without cleanup."""
    code = 3
    try:
        os.dup2(out, 1)  # what native code prints (HDF5's error stack, LMDB's assertion) comes back too
        os.dup2(out, 2)
        try:
            done = work()
            os.write(out, f"\nREAD {done}\n".encode(errors="replace"))
            code = 0
        except FirescaleError as exc:
            os.write(out, b"\nSTOPPED " + str(exc).encode(errors="replace"))
            code = 1
        except BaseException:
            os.write(out, ("\n" + traceback.format_exc()).encode(errors="replace"))
            code = 2
    finally:
        os._exit(code)


def run_in_child(work: Callable[[], object], timeout: float) -> tuple[int | None, str]:
    """Fork a child that runs `work` (what it returns is printed after READ; a FirescaleError after STOPPED);
    (wait status or None when it hung, all it wrote).  `classify` reads the two."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        _child(work, w)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    status: int | None = None
    reaped = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([r], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(r, 65536)
                if chunk:
                    chunks.append(chunk)
                    continue
                _, status = os.waitpid(pid, 0)  # end of output: the child has exited
                reaped = True
                break
    finally:
        os.close(r)
        if not reaped:   # out of time, or this process interrupted: the child goes with it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return status, b"".join(chunks).decode(errors="replace")


def run_child(dataset: Path, target: str, split: str, timeout: float) -> tuple[int | None, str]:
    """Fork a child that reads one split of a reader path; (wait status or None when it hung, all it wrote)."""
    return run_in_child(lambda: f"{read_through(dataset, target, split)} records", timeout)


def classify(status: int | None, output: str, damaged: Path) -> tuple[str, str]:
    """(outcome, message) of one child from its wait status and output."""
    if status is None:
        return "hung", "still reading when its time ran out"
    if os.WIFSIGNALED(status):
        return "crashed", f"killed by {signal.Signals(os.WTERMSIG(status)).name}: {output.strip()[-300:]}"
    code = os.WEXITSTATUS(status)
    if code == 0 and "\nREAD " in output:
        return "read", output.rsplit("\nREAD ", 1)[1].strip()
    if code == 1 and "\nSTOPPED " in output:
        message = output.rsplit("\nSTOPPED ", 1)[1]
        if "\n" in message.strip() or str(damaged) not in message:
            return "unclear", message.strip()
        return "stopped", message.strip()
    return "crashed", f"exit {code}: {output.strip()[-1500:]}"


def sweep(pristine: Path, work: Path, copies: int, *, seed: int = 0, timeout: float = 60.0,
          targets: tuple[str, ...] = TARGETS, progress=None) -> SweepResult:
    """Make `copies` damaged copies of the dataset folder `pristine` in `work` and read each in a child.

    `pristine` is a folder from `data ingest` with both formats; Caffe's HDF5 files are added to a copy
    of it first.  Copies go round the targets in turn, the split, file and damage drawn by `seed`.
    """
    rng = np.random.default_rng(seed)
    base = work / "pristine"
    shutil.copytree(pristine, base)
    write_caffe_hdf5(base)
    result = SweepResult()
    for n in range(copies):
        target = targets[n % len(targets)]
        split = ("train", "test")[int(rng.integers(2))]
        files = target_files(target, split)
        rel = files[int(rng.integers(len(files)))]
        copy = work / f"copy-{n:04d}"
        shutil.copytree(base, copy)
        kind, detail = damage_file(copy / rel, rng)
        damage = Damage(target, split, rel, kind, detail)
        start = time.monotonic()
        status, output = run_child(copy, target, split, timeout)
        outcome, message = classify(status, output, copy / rel)
        result.trials.append(Trial(damage, outcome, message, time.monotonic() - start))
        shutil.rmtree(copy)
        if progress is not None:
            progress(n, result.trials[-1])
    return result
