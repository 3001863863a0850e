"""The GPU check: one command that, on a bare GPU node, runs the GPU tests, trains the default experiment on the
GPU, sets the trainer against a bare loop and times four ImageNet nets, within a few minutes, into at most eight
files (docs/gpu-check.md).

Each part runs as a process of its own under a share of the time left (a part that finishes early leaves its
time to the next), so that a hang or a crash in one is recorded and the others still run.  Nothing here imports
a framework: the parts are `pytest`, `firescale data ingest`, `firescale train`, `firescale bench trainer` and
`python -m firescale.bench.gpu_steps`.  `--smoke` runs the same parts on tiny nets, data and budgets, on a CPU.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import firescale
from firescale.atomic import atomic_write_json, atomic_write_text, load_json
from firescale.errors import FirescaleError

GPU_CHECK_FORMAT = "firescale.bench.gpu_check/1"
# The folder the running package was imported from, first on the parts' PYTHONPATH so that they run this code.
IMPORTED_FROM = Path(firescale.__file__).resolve().parent.parent
CHECKOUT_VARIABLE = "FIRESCALE_CHECKOUT"
GPU_TESTS = "tests/train/test_torch_gpu.py"    # what the tests part runs, relative to the checkout
DEFAULT_FASHION = Path("/usr/share/datasets/fashion-mnist")   # Debian's dataset-fashion-mnist
# What comes back: the summary, every number in one JSON, and each part's log.
FILES = {"summary": "summary.md", "json": "gpu-check.json", "tests": "pytest.txt", "train": "train.txt",
         "bench": "bench-trainer.txt", "steps": "steps.txt"}
PARTS = ("tests", "train", "bench", "steps")
SHARES = {"tests": 0.25, "train": 0.2, "bench": 0.2, "steps": 0.35}   # of the time left when a part starts


@dataclass(frozen=True)
class Baseline:
    """The default experiment (workflow/config.yaml's fashion-lenet) and what its TensorFlow baseline reached."""

    experiment: str = "fashion-lenet"
    net: str = "lenet_same"
    solver: str = "workflow/solvers/lenet-fashion.prototxt"
    total_batch: int = 64
    top1: float = 0.849
    tolerance: float = 0.01
    train_s: float = 10.6
    source: str = ("docs/benchmarks/2026-11-23-zen5.md: the default sweep's baseline, TensorFlow on one Zen 5 "
                   "core, batch 64, 469 iterations: 84.9% top-1 in 10.6 s (85.0% on the Xeon of 2026-11-26)")

    @property
    def target(self) -> float:
        return round(self.top1 - self.tolerance, 6)


BASELINE = Baseline()


@dataclass(frozen=True)
class Plan:
    """What each part runs: the full check on a GPU, or tiny versions of it (`smoke`)."""

    smoke: bool
    precisions: tuple[str, ...]
    train_overrides: tuple[str, ...]
    bench_iterations: int
    bench_repeats: int
    nets: tuple[str, ...]
    batches: tuple[int, ...]
    step_precisions: tuple[str, ...]
    step_iterations: int
    step_warm_up: int
    floor_s: float       # the least a part is given, past the deadline if need be (a process's start is seconds)


FULL = Plan(False, ("fp32", "bf16"), (), 300, 2, ("alexnet", "nin", "resnet50", "vgg16"), (64, 128, 256),
            ("fp32", "tf32", "bf16"), 10, 2, 30.0)
SMOKE = Plan(True, ("fp32",), ("max_iter=20", "test_interval=20", "snapshot=0", "display=10"), 10, 1,
             ("lenet",), (4, 8), ("fp32", "bf16"), 2, 1, 25.0)


@dataclass
class PartResult:
    """How one part went: passed, failed, skipped or timed out, in how many seconds, and what it measured."""

    name: str
    status: str
    seconds: float = 0.0
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckOptions:
    """`firescale bench gpu`, resolved."""

    out: Path
    minutes: float = 6.0
    smoke: bool = False
    fashion: Path | None = DEFAULT_FASHION
    commit: str | None = None
    work: Path | None = None
    command: str = ""
    checkout: Path | None = None     # the firescale checkout whose tests, solvers and sites the parts use


def find_checkout(given: Path | None, environ: Mapping[str, str]) -> Path:
    """The checkout the check runs its tests from: `given` (--checkout), else $FIRESCALE_CHECKOUT, else the
    working folder, as docs/gpu-check.md runs it; one sentence when that folder holds no GPU tests."""
    if given is not None:
        where, folder = "--checkout", given
    elif environ.get(CHECKOUT_VARIABLE):
        where, folder = CHECKOUT_VARIABLE, Path(environ[CHECKOUT_VARIABLE])
    else:
        where, folder = "the working folder", Path.cwd()
    if not (folder / GPU_TESTS).is_file():
        raise FirescaleError(f"{where} {folder} holds no {GPU_TESTS}, the GPU tests the check runs; run it from a "
                             f"firescale checkout, or name one with --checkout DIR or {CHECKOUT_VARIABLE}")
    return folder.resolve()


class Check:
    """One run of the check: where it writes, its deadline, the environment of its processes."""

    def __init__(self, opts: CheckOptions, work: Path, say: Callable[[str], None]) -> None:
        self.opts, self.work, self.say = opts, work, say
        self.plan = SMOKE if opts.smoke else FULL
        self.start = time.monotonic()
        self.deadline = self.start + 60.0 * opts.minutes
        self.checkout = find_checkout(opts.checkout, os.environ)
        opts.out.mkdir(parents=True, exist_ok=True)
        self.env = check_environment(os.environ, self.checkout)

    def log(self, part: str) -> Path:
        return self.opts.out / FILES[part]

    def seconds_for(self, part: str) -> float:
        """This part's share of the time left, the parts after it sharing the rest; at least the plan's floor."""
        later = PARTS[PARTS.index(part):]
        left = self.deadline - time.monotonic()
        return max(self.plan.floor_s, left * SHARES[part] / sum(SHARES[p] for p in later))

    def run(self, argv: Sequence[str | os.PathLike[str]], part: str, timeout: float) -> tuple[int | None, float]:
        """Run `argv` from the checkout, its output appended to the part's log; (exit code or None when it ran
        past `timeout` and was stopped, seconds)."""
        return run_logged([str(a) for a in argv], self.log(part), timeout, self.env, self.checkout)


def check_environment(base: Mapping[str, str], checkout: Path) -> dict[str, str]:
    """The parts' environment: the running package first on PYTHONPATH (nothing is installed on a bare node), the
    checkout's sites, unbuffered output, and Open MPI allowed to start ranks as root (the device machine's commands
    run as root)."""
    env = {k: v for k, v in base.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORTED_FROM), *[p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p]])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("FIRESCALE_SITE_PATH", str(checkout / "site"))
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def run_logged(argv: list[str], log: Path, timeout: float, env: dict[str, str],
               cwd: Path) -> tuple[int | None, float]:
    """Run `argv` in a session of its own, its output appended to `log`; past `timeout` its whole process group
    is stopped (TERM, then KILL) and None is returned for its exit code."""
    t0 = time.monotonic()
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ {shlex.join(argv)}\n")
        fh.flush()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            code = None
            for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
                    break
            fh.write(f"\n[gpu check: stopped after {timeout:.0f} s]\n")
    return code, time.monotonic() - t0


def _firescale(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "firescale", *map(str, args)]


# ------------------------------------------------------------ the parts
def device_part(check: Check) -> dict[str, Any]:
    """The device and versions, from a process that imports torch (this one does not)."""
    path = check.work / "device.json"
    code, _ = check.run([sys.executable, "-m", "firescale.bench.gpu_steps", "--info", "--json", path], "steps", 120)
    info = load_json(path, "the device record") if code == 0 and path.is_file() else {}
    return info.get("device", {})


PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def tests_part(check: Check) -> PartResult:
    """pytest -m gpu on tests/train/test_torch_gpu.py: passed only when every test ran and passed."""
    timeout = check.seconds_for("tests")
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", GPU_TESTS, "-p", "no:cacheprovider",
            "-rA", "-q", "--durations=10"]
    if importlib.util.find_spec("pytest_timeout") is not None:   # a test that hangs (NCCL's set-up) fails alone
        argv += ["--timeout", str(int(max(timeout / 2, 30)))]
    code, took = check.run(argv, "tests", timeout)
    text = check.log("tests").read_text(encoding="utf-8", errors="replace")
    last = [line for line in text.splitlines() if PYTEST_COUNTS.search(line)]
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n)
              for n, k in PYTEST_COUNTS.findall(last[-1] if last else "")}
    failing = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    if code is None:
        status, note = "timed out", f"stopped after {timeout:.0f} s"
    elif code == 0 and counts.get("passed", 0) and not counts.get("skipped", 0):
        status, note = "passed", ""
    elif code == 0 and counts.get("skipped", 0) and not counts.get("passed", 0):
        status, note = "skipped", "every test was skipped: no CUDA GPU here"
    else:
        status, note = "failed", f"pytest exited {code}"
    return PartResult("tests", status, took, note, {"counts": counts, "failing": failing, "exit_code": code})


def _dataset(check: Check, timeout: float) -> tuple[Path, str, str]:
    """The default experiment's data ingested as HDF5 (the node has no lmdb), and its solver; digits in smoke
    mode or when Fashion-MNIST is not on this node (its name says which)."""
    fashion = check.opts.fashion
    if not check.plan.smoke and fashion is not None and fashion.is_dir():
        args = ["--source", f"idx:{fashion.resolve()}", "--name", "fashion-mnist"]
        name, solver = "fashion-mnist", BASELINE.solver
    else:
        args, name, solver = ["--source", "digits"], "digits", "workflow/solvers/lenet-digits.yaml"
    path = check.work / "data" / name
    if not (path / "manifest.json").is_file():
        code, _ = check.run(_firescale("data", "ingest", *args, "--formats", "hdf5", "--out", check.work / "data"),
                            "train", min(timeout, 300.0))
        if code != 0:
            raise RuntimeError(f"firescale data ingest {' '.join(args)} failed (exit {code}); see {FILES['train']}")
    return path, name, solver


def _train_row(out: Path, precision: str) -> dict[str, Any]:
    result = load_json(out / "result.json", "the run record")
    final = result["evals"][-1] if result["evals"] else {}
    return {"precision": precision, "top1": final.get("top1"), "top5": final.get("top5"), "iter": final.get("iter"),
            "reached_target": result["reached_target"], "target": result["target_top1"],
            "time_to_accuracy_s": result["time_to_accuracy_s"], "train_time_s": result["train_time_s"],
            "images_per_s": result["images_per_s"], "iterations": result["iterations"],
            "device": result["allreduce"]["device"], "process_group": result["versions"].get("process_group"),
            "versions": {k: result["versions"].get(k) for k in ("torch", "cuda", "cudnn", "nccl", "precision")},
            "per_iteration": result["per_iteration"]}


def train_part(check: Check) -> PartResult:
    """`firescale train --framework pytorch` of the default experiment in each precision, one rank."""
    t0 = time.monotonic()
    timeout = check.seconds_for("train")
    data, name, solver = _dataset(check, timeout)
    fashion = name == "fashion-mnist"
    rows, failures = [], []
    for precision in check.plan.precisions:
        out = check.work / f"train-{name}-{precision}"
        args: list[str | os.PathLike[str]] = [
            "train", "--framework", "pytorch", "--precision", precision, "--dataset", data, "--net", BASELINE.net,
            "--solver", solver, "--total-batch", str(BASELINE.total_batch), "--out", out]
        args += ["--target", str(BASELINE.target)] if fashion else []
        for override in check.plan.train_overrides:
            args += ["--set", override]
        left = timeout - (time.monotonic() - t0)
        if left < 5:
            failures.append(f"{precision}: not run, the part's {timeout:.0f} s were spent")
            continue
        code, _ = check.run(_firescale(*args), "train", left)
        if code != 0:
            failures.append(f"{precision}: " + ("timed out" if code is None else f"exit {code}"))
            continue
        row = _train_row(out, precision)
        rows.append(row)
        if not check.plan.smoke and not str(row["device"]).startswith("cuda"):
            failures.append(f"{precision}: trained on {row['device']}, not a GPU")
        elif fashion and not row["reached_target"]:
            failures.append(f"{precision}: top-1 {row['top1']} below the target {BASELINE.target}")
    status = "failed" if failures else "passed"
    note = "; ".join(failures) + ("" if fashion or check.plan.smoke else
                                  f"; no Fashion-MNIST at {check.opts.fashion}: trained on digits instead")
    return PartResult("train", status, time.monotonic() - t0, note.strip("; "),
                      {"dataset": name, "solver": solver, "baseline": asdict(BASELINE), "runs": rows})


def bench_part(check: Check) -> PartResult:
    """`firescale bench trainer --framework pytorch --ranks 1`: the trainer against the bare torch loop."""
    if importlib.util.find_spec("firescale.bench.bare_loop_torch") is None:
        return PartResult("bench", "skipped", 0.0, "firescale.bench.bare_loop_torch is not in this checkout yet "
                                                   "(bench trainer --framework pytorch needs it)")
    t0 = time.monotonic()
    timeout = check.seconds_for("bench")
    data, name, solver = _dataset(check, timeout)
    path = check.work / "bench-trainer.json"
    code, _ = check.run(_firescale("bench", "trainer", "--framework", "pytorch", "--ranks", "1", "--dataset",
                                   str(data), "--net", BASELINE.net, "--solver", solver, "--batch-per-rank",
                                   str(BASELINE.total_batch), "--iterations", str(check.plan.bench_iterations),
                                   "--repeats", str(check.plan.bench_repeats), "--workdir",
                                   str(check.work / "bench"), "--json", str(path)),
                        "bench", timeout - (time.monotonic() - t0))
    took = time.monotonic() - t0
    if code != 0 or not path.is_file():
        return PartResult("bench", "timed out" if code is None else "failed", took,
                          f"bench trainer exited {code}; see {FILES['bench']}")
    return PartResult("bench", "passed", took, "", {"dataset": name, **load_json(path, "the bench record")})


def steps_part(check: Check) -> PartResult:
    """python -m firescale.bench.gpu_steps over the plan's nets, batches and precisions, within its share."""
    t0 = time.monotonic()
    timeout = check.seconds_for("steps")
    plan, path = check.plan, check.work / "steps.json"
    budget = max(timeout - (30.0 if not plan.smoke else 10.0), 1.0)   # the process's start and the nets' builds
    code, took = check.run([sys.executable, "-m", "firescale.bench.gpu_steps", "--json", path, "--nets",
                            ",".join(plan.nets), "--batches", ",".join(map(str, plan.batches)), "--precisions",
                            ",".join(plan.step_precisions), "--iterations", str(plan.step_iterations),
                            "--warm-up", str(plan.step_warm_up), "--seconds", f"{budget:.0f}"], "steps", timeout)
    if code != 0 or not path.is_file():
        return PartResult("steps", "timed out" if code is None else "failed", time.monotonic() - t0,
                          f"gpu_steps exited {code}; see {FILES['steps']}")
    data = load_json(path, "the step timings")
    rows = data["rows"]
    done = sum(r["status"] == "ok" for r in rows)
    note = "" if done == len(rows) else f"{done} of {len(rows)} sides timed; the others say why"
    return PartResult("steps", "passed" if done else "failed", time.monotonic() - t0, note, data)


# ------------------------------------------------------------ the whole check
def git_commit(repo: Path = IMPORTED_FROM) -> str | None:
    """The commit of the checkout at `repo` (default: the running package's), with '+changes' when files differ
    from it; None where there is no git here."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run_gpu_check(opts: CheckOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every part in turn, each in its share of `opts.minutes`; writes FILES under `opts.out` and returns the
    record that gpu-check.json holds."""
    import tempfile

    from firescale.bench.gpu_summary import render_summary

    with contextlib.ExitStack() as stack:
        work = opts.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="firescale-gpu-check-")))
        work.mkdir(parents=True, exist_ok=True)
        check = Check(opts, work, say)
        device = device_part(check)
        say(f"device: {device.get('name')} ({device.get('device')}), torch {device.get('torch')}, "
            f"CUDA {device.get('cuda')}, cuDNN {device.get('cudnn')}, NCCL {device.get('nccl')}")
        no_gpu = not opts.smoke and not str(device.get("device", "")).startswith("cuda")
        parts = []
        for name, part in (("tests", tests_part), ("train", train_part), ("bench", bench_part),
                           ("steps", steps_part)):
            try:
                if no_gpu:      # the full check on a CPU would only spend its minutes: --smoke is for CPUs
                    result = PartResult(name, "failed", 0.0, "no CUDA GPU seen (steps.txt); on a CPU, run --smoke")
                else:
                    result = part(check)
            except Exception as exc:      # one part's failure is recorded; the parts after it still run
                result = PartResult(name, "failed", 0.0, f"{type(exc).__name__}: {exc}")
            parts.append(result)
            say(f"{name}: {result.status} in {result.seconds:.0f} s" + (f" ({result.note})" if result.note else ""))
        record = {"format": GPU_CHECK_FORMAT, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                  "commit": opts.commit or git_commit(check.checkout) or "unknown", "command": opts.command,
                  "smoke": opts.smoke, "minutes": opts.minutes, "seconds": time.monotonic() - check.start,
                  "device": device, "parts": [asdict(p) for p in parts],
                  "files": {k: f for k, f in FILES.items() if k in ("json", "summary") or (opts.out / f).is_file()}}
        atomic_write_json(opts.out / FILES["json"], record)
        atomic_write_text(opts.out / FILES["summary"], render_summary(record))
    return record


def check_passed(record: dict[str, Any]) -> bool:
    """Whether every part passed or was skipped for a reason that is not a fault (no GPU in smoke mode, a module
    not landed yet)."""
    return all(p["status"] in ("passed", "skipped") for p in record["parts"])
