"""torch for `make setup`: its build chosen from pip's dry-run reports, never a CUDA build by surprise.

On a CPU set-up the pinned torch must be a CPU build.  pip first says what it would install
(`pip install --dry-run --report`), and the report tells the builds apart: a CUDA build of torch brings CUDA's
packages (nvidia-*, cuda-*, triton) with it, some 3 GB of wheels that no CPU node can use.  The choice, in order:

1. where the user named an index (TORCH_INDEX), that index, or a stop;
2. what pip finds as it is (a CPU wheel on the machine's disk, say, through pip's find-links);
3. PyTorch's CPU index (CPU_INDEX), tried only when the first plan was a CUDA build;
4. the CUDA build, only with the opt-in ALLOW_CUDA_TORCH=1 (it runs on the CPU, at the cost of the download),
   else a stop in one sentence that names the opt-in.

An index pip cannot reach gives no error of its own: pip plans from the others.  So the third step's plan is
judged like the second's, by what it holds.  GPU=1 installs what pip plans; the guard is for CPU set-ups.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from firescale.errors import FirescaleError

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")     # packages only a CUDA build of torch brings
OPT_IN = "ALLOW_CUDA_TORCH=1"
# The index pip may not reach: one try, not pip's five with back-off (a closed network answers at once or not at all).
PROBE_OPTIONS = ("--retries", "1", "--timeout", "20")


class Planner(Protocol):
    """One pip dry run with extra arguments, returning its report; `probe_failure` says why the last run given
    PROBE_OPTIONS could not reach its index ("" when it could, or nothing said)."""

    probe_failure: str

    def __call__(self, extra: Sequence[str]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Plan:
    """What one pip dry run would install."""

    packages: tuple[tuple[str, str], ...]   # (name, version), as pip's report lists them

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> Plan:
        try:
            packages = tuple((p["metadata"]["name"], p["metadata"]["version"]) for p in report["install"])
        except (KeyError, TypeError) as exc:
            raise FirescaleError(f"pip's dry-run report has no install list with names and versions ({exc})") from None
        return cls(packages)

    @property
    def cuda(self) -> list[str]:
        return [name for name, _ in self.packages if name.lower().startswith(CUDA_PREFIXES)]

    def version_of(self, name: str) -> str:
        return next((v for n, v in self.packages if n.lower() == name), "?")


@dataclass(frozen=True)
class Choice:
    """The pip arguments to install with, and the line that says where torch comes from."""

    index: str | None
    line: str


def choose(torch: str, planner: Planner, *, index: str | None = None, allow_cuda: bool = False,
           gpu: bool = False, python: str = "this Python") -> Choice:
    """Where `torch` (a pip requirement, e.g. "torch==2.13.0") comes from; `planner(extra_args)` is one pip dry
    run returning its report.  Raises FirescaleError, one sentence, where only a CUDA build is in reach."""
    first = Plan.from_report(planner(_index_args(index)))
    if gpu:
        return Choice(index, f"firescale: torch {first.version_of('torch')} (GPU=1: the build pip chooses)")
    if not first.cuda:
        return Choice(index, f"firescale: torch {first.version_of('torch')}, a CPU build"
                             + (f", from {index}" if index else ""))
    if index is not None:   # the user's own index: no second guess
        raise FirescaleError(f"pip would install a CUDA build of {torch} from {index} ({_few(first.cuda)}) on a CPU "
                             f"set-up; name an index with torch's CPU build, or make setup {OPT_IN} to take it anyway")
    cpu = Plan.from_report(planner([*_index_args(CPU_INDEX), *PROBE_OPTIONS]))
    if not cpu.cuda:
        return Choice(CPU_INDEX, f"firescale: no CPU build of {torch} on this machine for {python}; taking "
                                 f"torch {cpu.version_of('torch')} from PyTorch's CPU index ({CPU_INDEX})")
    if allow_cuda:
        return Choice(None, f"firescale: {OPT_IN}: installing PyPI's CUDA build of {torch} ({_few(first.cuda)}, "
                            "about 3 GB); it runs on the CPU here")
    why = f"pip: {planner.probe_failure}" if planner.probe_failure else "not reachable from here?"
    raise FirescaleError(f"the only {torch} pip reaches for {python} is a CUDA build ({_few(first.cuda)}, about 3 GB "
                         f"of wheels) and PyTorch's CPU index ({CPU_INDEX}) gave no CPU build ({why}); make setup "
                         f"{OPT_IN} installs the CUDA build to run on the CPU (docs/install.md)")


def _index_args(index: str | None) -> list[str]:
    return ["--extra-index-url", index] if index else []


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


# What pip says when an index is out of reach (its warnings, one a package, are kept from the terminal).
UNREACHABLE = re.compile(r"Failed to resolve '[^']+'|Connection refused|timed out|Network is unreachable")


class PipPlanner:
    """`python -m pip install --dry-run --report` for `requirements`; a probe's warnings are read, not shown."""

    def __init__(self, python: str, requirements: Sequence[str], report_dir: Path) -> None:
        self.python, self.requirements, self.report_dir = python, list(requirements), report_dir
        self.probe_failure = ""

    def __call__(self, extra: Sequence[str]) -> dict[str, Any]:
        probe = all(option in extra for option in PROBE_OPTIONS)
        self.report_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.report_dir, prefix="torch-plan.", suffix=".json", delete=False) as f:
            report = Path(f.name)
        try:
            proc = subprocess.run([self.python, "-m", "pip", "install", "-q", "--dry-run", "--report", str(report),
                                   *self.requirements, *extra], stderr=subprocess.PIPE if probe else None, text=True)
            if probe:
                found = UNREACHABLE.search(proc.stderr or "")
                self.probe_failure = found.group(0) if found else ""
            if proc.returncode != 0:
                if probe:
                    sys.stderr.write(proc.stderr or "")
                raise FirescaleError(f"pip's dry run of {' '.join(self.requirements)} failed (exit status "
                                     f"{proc.returncode}); its words are above")
            data: dict[str, Any] = json.loads(report.read_text())
            return data
        finally:
            report.unlink(missing_ok=True)


def build_parser() -> argparse.ArgumentParser:
    """`python -m firescale.cluster.torch_install`'s arguments."""
    parser = argparse.ArgumentParser(prog="python -m firescale.cluster.torch_install", allow_abbrev=False,
                                     description="Install torch for make setup (see the module's docstring).")
    parser.add_argument("requirements", nargs="+", help="torch's requirement first, then any to install beside it")
    parser.add_argument("--index", default="", help="TORCH_INDEX: an extra index to take torch from")
    parser.add_argument("--allow-cuda", action="store_true", help="ALLOW_CUDA_TORCH=1: a CUDA build on a CPU set-up")
    parser.add_argument("--gpu", action="store_true", help="GPU=1: the build pip chooses")
    parser.add_argument("--report-dir", type=Path, required=True, help="where pip's dry-run reports are written")
    parser.add_argument("--dry-run", action="store_true", help="say the choice, install nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    python = sys.executable
    version = ".".join(map(str, sys.version_info[:3]))
    try:
        choice = choose(args.requirements[0], PipPlanner(python, args.requirements, args.report_dir),
                        index=args.index or None, allow_cuda=args.allow_cuda, gpu=args.gpu,
                        python=f"Python {version}")
    except FirescaleError as exc:
        print(f"firescale: {exc}", file=sys.stderr)
        return 1
    print(choice.line, flush=True)
    if args.dry_run:
        return 0
    proc = subprocess.run([python, "-m", "pip", "install", "-q", *args.requirements, *_index_args(choice.index)])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
