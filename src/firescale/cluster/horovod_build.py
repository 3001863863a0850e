"""Horovod's build: the flags `make setup` builds it with, the libraries a build carries, whether they suit a site."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from firescale.errors import FirescaleError

if TYPE_CHECKING:  # annotations only
    from firescale.cluster.site import SiteProfile

HOROVOD_VERSION = "0.28.1"   # the Makefile passes its own HOROVOD_VERSION
# Every build: TensorFlow's ops, MPI and Gloo as controllers, MPI for CPU tensors, no other framework.
CPU_BUILD = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
             "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "MPI"}
# What a GPU site's gradients need from the build: Horovod sums GPU tensors with NCCL
# (firescale.cluster.collectives models NCCL on every GPU site).
GPU_OPERATIONS = "NCCL"
# Where TensorFlow 2.15.1's `and-cuda` packages (pyproject.toml's `gpu` extra) put NCCL: nvidia-nccl-cu12
# ships nccl.h and libnccl.so.2 only, with neither a static library nor the unversioned libnccl.so that
# CMake's find_library looks for.
PIP_NCCL = Path("nvidia") / "nccl"
PIP_NCCL_SONAME = "libnccl.so.2"
# Variables a site's NCCL module sets (NCCL_HOME on most clusters, NCCL_ROOT with Spack's modules).
NCCL_MODULE_VARIABLES = ("NCCL_HOME", "NCCL_ROOT")
# Where a CUDA toolkit is named (a site's CUDA module sets CUDA_HOME or CUDA_PATH); nvcc on the PATH comes last.
CUDA_HOME_VARIABLES = ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")


@dataclass(frozen=True)
class BuildPlan:
    """How Horovod is built: the variables pip's build sees, a link to make first, where each part comes from."""

    gpu: bool
    environment: dict[str, str]
    links: tuple[tuple[Path, str], ...] = ()     # (link, target) made before the build
    sources: tuple[str, ...] = field(default=())  # one line each: which NCCL and CUDA, and why

    @property
    def summary(self) -> str:
        return "TensorFlow, MPI, Gloo" + (", NCCL for GPU tensors" if self.gpu else "")

    def lines(self) -> list[str]:
        """The plan in words, then every variable as the shell would set it."""
        out = [f"firescale: horovod build ({self.summary}):", *(f"  {s}" for s in self.sources)]
        out += [f"  ln -s {shlex.quote(t)} {shlex.quote(str(link))}" for link, t in self.links]
        out += [f"  {k}={shlex.quote(v)}" for k, v in sorted(self.environment.items())]
        return out


def site_packages() -> Path:
    """The running interpreter's site-packages (the virtualenv's, when run from it)."""
    return Path(sysconfig.get_paths()["purelib"])


def _given(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _nccl(site_packages: Path, environ: Mapping[str, str]) -> tuple[dict[str, str], tuple[tuple[Path, str], ...], str]:
    """Horovod's NCCL variables: ones already set are kept; then a site module's NCCL; else pip's."""
    if _given(environ, "HOROVOD_NCCL_HOME") or (_given(environ, "HOROVOD_NCCL_INCLUDE")
                                                and _given(environ, "HOROVOD_NCCL_LIB")):
        kept = {k: environ[k] for k in ("HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB",
                                        "HOROVOD_NCCL_LINK") if _given(environ, k)}
        return kept, (), "NCCL: as HOROVOD_NCCL_* are set in this shell"
    for name in NCCL_MODULE_VARIABLES:
        module_home = _given(environ, name)
        if module_home:
            return {"HOROVOD_NCCL_HOME": module_home}, (), f"NCCL: {module_home}, from ${name} (a site module)"
    home = site_packages / PIP_NCCL
    lib = home / "lib"
    env = {"HOROVOD_NCCL_HOME": str(home), "HOROVOD_NCCL_INCLUDE": str(home / "include"),
           "HOROVOD_NCCL_LIB": str(lib), "HOROVOD_NCCL_LINK": "SHARED",
           # pip's folder is on no loader path: Horovod's library finds libnccl.so.2 through its run path
           "LDFLAGS": " ".join(w for w in (f"-Wl,-rpath,{lib}", environ.get("LDFLAGS", "")) if w)}
    link = (lib / "libnccl.so", PIP_NCCL_SONAME)
    return env, (link,), f"NCCL: {home}, from pip's nvidia-nccl-cu12 (TensorFlow 2.15.1's and-cuda), linked shared"


def _cuda(environ: Mapping[str, str]) -> tuple[str, str]:
    """The CUDA toolkit whose nvcc compiles Horovod's CUDA kernels, and where it was found."""
    for name in CUDA_HOME_VARIABLES:
        home = _given(environ, name)
        if home:
            return home, f"CUDA: {home}, from ${name}"
    nvcc = shutil.which("nvcc", path=environ.get("PATH", os.defpath))
    if nvcc:
        home = str(Path(nvcc).resolve().parent.parent)
        return home, f"CUDA: {home}, from nvcc on the PATH"
    raise FirescaleError(
        "GPU=1 needs a CUDA toolkit's nvcc to compile Horovod's CUDA kernels and none was found (no "
        f"{', '.join('$' + v for v in CUDA_HOME_VARIABLES)}, no nvcc on the PATH); TensorFlow 2.15.1's pip "
        "packages ship none (nvidia-cuda-nvcc-cu12 12.2.140 holds ptxas only), so load the site's CUDA module "
        "(e.g. `module load cuda/12.2`) or set CUDA_HOME to a CUDA 12 toolkit")


def build_plan(gpu: bool, site_packages: Path, environ: Mapping[str, str]) -> BuildPlan:
    """The build for a CPU stack, or with `gpu` the NCCL build: NCCL from the variables a site's module
    sets, else from pip's nvidia-nccl-cu12 under `site_packages`; nvcc from the site's CUDA."""
    if not gpu:
        return BuildPlan(False, dict(CPU_BUILD))
    nccl, links, nccl_source = _nccl(site_packages, environ)
    cuda_home, cuda_source = _cuda(environ)
    env = {**CPU_BUILD, "HOROVOD_GPU_OPERATIONS": GPU_OPERATIONS, "HOROVOD_CUDA_HOME": cuda_home, **nccl}
    return BuildPlan(True, env, links, (nccl_source, cuda_source))


def check_plan(plan: BuildPlan) -> None:
    """Refuse a plan whose files are not there, naming the file and what provides it."""
    if not plan.gpu:
        return
    nvcc = Path(plan.environment["HOROVOD_CUDA_HOME"]) / "bin" / "nvcc"
    if not os.access(nvcc, os.X_OK):
        raise FirescaleError(f"HOROVOD_CUDA_HOME: {nvcc} is not an executable nvcc; point CUDA_HOME (or "
                             "HOROVOD_CUDA_HOME) at a CUDA 12 toolkit, or load the site's CUDA module")
    include = plan.environment.get("HOROVOD_NCCL_INCLUDE") or str(Path(plan.environment["HOROVOD_NCCL_HOME"]) /
                                                                  "include")
    if not (Path(include) / "nccl.h").is_file():
        raise FirescaleError(f"NCCL: {Path(include) / 'nccl.h'} does not exist; install pyproject.toml's `gpu` "
                             "extra (nvidia-nccl-cu12, as `make setup GPU=1` does) or load the site's NCCL module")
    for link, target in plan.links:
        if not (link.parent / target).is_file():
            raise FirescaleError(f"NCCL: {link.parent / target} does not exist; reinstall nvidia-nccl-cu12")


@dataclass(frozen=True)
class HorovodBuilt:
    """What the installed Horovod carries."""

    version: str
    mpi: bool
    gloo: bool
    nccl: bool
    where: str = ""

    @property
    def libraries(self) -> list[str]:
        return [name for name, built in (("MPI", self.mpi), ("Gloo", self.gloo), ("NCCL", self.nccl)) if built]


def horovod_built() -> HorovodBuilt | None:
    """The installed Horovod's version and libraries (imports TensorFlow); None when it is not installed, an
    error naming the cause when it is installed but does not load."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter would bury the answer
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as exc:   # not installed; or its library does not load (TensorFlow's NotFoundError, OSError)
        if isinstance(exc, ModuleNotFoundError) and exc.name == "horovod":
            return None
        text = " ".join(str(exc).split())
        raise FirescaleError(f"Horovod does not load on {socket.gethostname().split('.')[0]}: {text}") from None
    return HorovodBuilt(str(horovod.__version__), bool(hvd.mpi_built()), bool(hvd.gloo_built()),
                        bool(hvd.nccl_built()), str(Path(horovod.__file__).parent))


def build_satisfied(built: HorovodBuilt | None, version: str, gpu: bool) -> bool:
    """Whether `built` is the asked version with MPI and Gloo, and NCCL when `gpu`."""
    return (built is not None and built.version == version and built.mpi and built.gloo
            and (built.nccl or not gpu))


def site_gpu_operations(site: SiteProfile | Mapping[str, Any]) -> str | None:
    """The library the site's Horovod must have been built with for GPU tensors: NCCL on a GPU site."""
    config = site if isinstance(site, Mapping) else site.config
    return GPU_OPERATIONS if config["device"].get("kind", "gpu") == "gpu" else None


def check_build(built: HorovodBuilt | None, gpu_operations: str | None, *, whose: str = "this job's site") -> str:
    """One line saying the build suits a site that needs `gpu_operations`; else one sentence as the error."""
    host = socket.gethostname().split(".")[0]
    if built is None:
        raise FirescaleError(f"Horovod is not installed on {host} (no module horovod.tensorflow in "
                             f"{sys.executable}); run `make setup` or set the site's environment.venv")
    if gpu_operations == GPU_OPERATIONS and not built.nccl:
        raise FirescaleError(
            f"Horovod {built.version} on {host} ({built.where}) was built without NCCL (it carries "
            f"{', '.join(built.libraries) or 'no collective library'}), but {whose} has GPUs, whose gradients "
            f"Horovod must sum with NCCL; rebuild it with `make setup GPU=1` (HOROVOD_GPU_OPERATIONS=NCCL)")
    return f"Horovod {built.version} on {host} carries {', '.join(built.libraries)}, as {whose} needs"


def collective_library(*, device: str, mpi_enabled: bool, gloo_enabled: bool, nccl_built: bool) -> str:
    """The library Horovod sums a tensor on `device` with: NCCL for a GPU tensor when built with it, else
    Gloo when its context is up, else MPI (the order of Horovod 0.28.1's operation manager)."""
    if device.upper().startswith("GPU") and nccl_built:
        return "NCCL"
    if gloo_enabled:
        return "Gloo"
    return "MPI" if mpi_enabled else "none"


def collectives_record(hvd: Any, device: str) -> dict[str, Any]:
    """For the run record: the collective library that summed the gradients on `device`, and the facts
    Horovod gave for it (after hvd.init())."""
    facts = {"mpi_enabled": bool(hvd.mpi_enabled()), "gloo_enabled": bool(hvd.gloo_enabled()),
             "nccl_built": bool(hvd.nccl_built())}
    library = collective_library(device=device, **facts)
    return {"library": library, "gpu_operations": library if library == "NCCL" else None, **facts}


def install(version: str, gpu: bool, environ: Mapping[str, str]) -> int:
    """`make setup`'s Horovod step: nothing when the installed build is the one asked for, else build it."""
    try:
        built = horovod_built()
    except FirescaleError:
        built = None   # a build that does not load is rebuilt
    what = "MPI, Gloo and NCCL" if gpu else "MPI and Gloo"
    if build_satisfied(built, version, gpu):
        print(f"firescale: horovod {version} with {what} already built")
        return 0
    if gpu and built is not None and built.version == version and not built.nccl:
        print(f"firescale: horovod {version} is built without NCCL; GPU=1 rebuilds it with NCCL", flush=True)
    plan = build_plan(gpu, site_packages(), environ)
    check_plan(plan)
    if gpu:
        print("\n".join(plan.lines()))
    for link, target in plan.links:
        if not link.exists():
            link.symlink_to(target)
    minutes = "about 4 minutes on 2 cores" if not gpu else "longer with CUDA kernels"
    print(f"firescale: building horovod {version} ({plan.summary}); {minutes}", flush=True)
    # A same-version rebuild must not reuse pip's cached wheel of the other build.
    again = ["--force-reinstall", "--no-deps", "--no-cache-dir"] if gpu else []
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", *again, f"horovod=={version}"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env = {**environ, **plan.environment, "MAKEFLAGS": f"-j{cores}"}
    return subprocess.run(argv, env=env).returncode


def build_parser() -> argparse.ArgumentParser:
    """`python -m firescale.cluster.horovod_build`'s arguments (no abbreviation taken, as no firescale parser
    takes one)."""
    parser = argparse.ArgumentParser(prog="python -m firescale.cluster.horovod_build", allow_abbrev=False,
                                     description="plan or run Horovod's build against this interpreter's stack")
    parser.add_argument("action", choices=("plan", "install"),
                        help="plan: print the build's variables; install: build unless already built as asked")
    parser.add_argument("--gpu", action="store_true", help="build with HOROVOD_GPU_OPERATIONS=NCCL")
    parser.add_argument("--version", default=HOROVOD_VERSION, help=f"Horovod's version (default {HOROVOD_VERSION})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m firescale.cluster.horovod_build {plan,install} [--gpu]`, run by the Makefile and on conda sites."""
    args = build_parser().parse_args(argv)
    try:
        if args.action == "plan":
            print("\n".join(build_plan(args.gpu, site_packages(), os.environ).lines()))
            return 0
        return install(args.version, args.gpu, os.environ)
    except FirescaleError as exc:
        print(f"firescale: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
