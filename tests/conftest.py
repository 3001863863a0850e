"""Shared fixtures: the repository root, and running a command as N MPI ranks on localhost; how the
suite is shared between pytest-xdist workers (`make test` runs two)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpitools import mpirun_argv

REPO = Path(__file__).resolve().parents[1]
# Tiers that start daemons once per worker and mostly wait (a real walltime, a virtual cluster's
# sweep): they go first.  `make test` distributes by file (`--dist loadfile`), so a module's
# expensive fixtures (a real sweep, a trained net) run once; xdist's `loadgroup` would keep a whole
# tier in one worker, but pytest-xdist 3.8 cannot regroup items under pytest 9 (it sets a node-id
# attribute pytest 9 no longer reads), so a tier's files may start their own Slurm or cluster per worker.
TIER_GROUPS = ("slurm", "vcluster")


def pytest_addoption(parser):
    parser.addoption("--aside", choices=("include", "exclude", "only"), default="include",
                     help="the tests marked `aside`, which sleep while a scheduler's clock runs: run them with the "
                          "rest (default), leave them out, or run only them (`make test` runs them in a pytest "
                          "of their own beside the workers)")


def pytest_collection_modifyitems(config, items):
    """The tests `--aside` asks for; the tiers first, the rest as collected."""
    mode = config.getoption("aside")
    if mode != "include":
        wanted = mode == "only"
        dropped = [item for item in items if bool(item.get_closest_marker("aside")) != wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if bool(item.get_closest_marker("aside")) == wanted]
    items.sort(key=lambda item: not any(item.get_closest_marker(t) for t in TIER_GROUPS))


def _aside_report_path(config) -> None:
    """`make test` runs `--aside only` beside the workers with the same PYTEST_ARGS: its --junitxml report
    goes to NAME-aside.xml beside the workers' NAME.xml, rather than over it."""
    path = config.option.xmlpath
    if path and config.getoption("aside") == "only":
        stem, dot, suffix = path.rpartition(".")
        config.option.xmlpath = f"{stem}-aside.{suffix}" if dot else f"{path}-aside"


@pytest.hookimpl(tryfirst=True)   # before pytest's junitxml plugin opens its report
def pytest_configure(config):
    """An xdist worker keeps to one core of its own, as a rank does: two workers then share the machine
    without one rank's pinning landing on the other worker's core.  Several ranks in one worker share
    its core, so MPI must yield while it waits rather than spin."""
    _aside_report_path(config)
    # TensorFlow's oneDNN kernels on every x86 CPU, as on those with AVX-512 where they are the default: the
    # memory model describes their allocations (bench/memory_probe.py), and each worker may load TensorFlow
    # before the memory tests do.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    # Commands run from scratch folders find the project's sites as a user's shell would: through
    # FIRESCALE_SITE_PATH (a site named in ./site comes first).
    os.environ.setdefault("FIRESCALE_SITE_PATH", str(REPO / "site"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_getaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and len(cpus) >= workers:
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})
        os.environ["OMPI_MCA_mpi_yield_when_idle"] = "1"


# A test marked with a backend needs its framework: without it the test fails saying so, never skips, unless the
# run deselects the tier on purpose (PYTEST_ARGS="-m 'not pytorch'").
BACKEND_MODULES = {"tensorflow": ("tensorflow", "horovod"), "pytorch": ("torch",)}


def pytest_ignore_collect(collection_path, config):
    """A test module whose `pytestmark` names a backend this Python lacks, in a run that leaves that backend's
    tier out on purpose (-m 'not pytorch'), is not imported: its imports need the framework, and each of its
    tests would be deselected anyway.  Any other module is imported, and one that needs a missing framework
    fails there, loudly (so does a file named on the command line, which pytest collects without asking)."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    left_out = _backends_left_out(config.option.markexpr or "")
    return True if left_out & _module_marks(collection_path) else None


def _backends_left_out(markexpr: str) -> set[str]:
    """The backends that `-m` deselects by name ("not pytorch") and whose framework this Python lacks."""
    import importlib.util
    import re

    return {marker for marker, modules in BACKEND_MODULES.items()
            if re.search(rf"\bnot\s+{marker}\b", markexpr)
            and any(importlib.util.find_spec(m) is None for m in modules)}


def _module_marks(path: Path) -> set[str]:
    """The names of the marks a test file's module-level `pytestmark` gives all its tests (pytest.mark.NAME)."""
    import ast

    marks: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks |= {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return marks


def pytest_runtest_setup(item):
    import importlib.util

    for marker, modules in BACKEND_MODULES.items():
        missing = [m for m in modules if item.get_closest_marker(marker) and importlib.util.find_spec(m) is None]
        if missing:
            pytest.fail(f"this test needs the {marker} backend, and this Python lacks {', '.join(missing)}: run "
                        f"`make setup`, or deselect the tier with -m 'not {marker}'", pytrace=False)
    if item.get_closest_marker("gpu"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU (the GPU check runs these on a GPU node)")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def digits_dataset(tmp_path_factory) -> Path:
    """scikit-learn's digits ingested once per test worker (`firescale data ingest --source digits`), for tests
    that only read it: they write their runs elsewhere."""
    out = tmp_path_factory.mktemp("digits-once")
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return out / "digits"


@pytest.fixture
def run_ranks():
    """Run `firescale ARGS...` (or any argv starting with an executable path) as N ranks.

    Returns the CompletedProcess; raises with the output when the ranks fail.
    """

    def run(n: int, args: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = args if args and os.path.isabs(args[0]) else [sys.executable, "-m", "firescale", *args]
        full_env = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1",
                    "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        proc = subprocess.run(mpirun_argv(n, argv, full_env), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env={**os.environ, **full_env})
        if check and proc.returncode != 0:
            raise AssertionError(f"{n} ranks of {args} exited {proc.returncode}\n"
                                 f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
        return proc

    return run
