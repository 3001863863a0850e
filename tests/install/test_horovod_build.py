"""Horovod's build: the flags `make setup` plans (GPU=1: NCCL), the installed build seen for what it is."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from firescale.cluster.horovod_build import (
    CPU_BUILD,
    HorovodBuilt,
    build_plan,
    build_satisfied,
    check_build,
    check_plan,
    horovod_built,
    site_packages,
)
from firescale.errors import FirescaleError

REPO = Path(__file__).resolve().parents[2]
# What the Makefile's Horovod step set before GPU=1 existed: a CPU build must keep exactly these.
OLD_CPU_FLAGS = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
                 "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "MPI"}


def pip_nccl(root: Path) -> Path:
    """site-packages laid out as nvidia-nccl-cu12 2.16.5 installs it: nccl.h and libnccl.so.2, nothing else."""
    (root / "nvidia" / "nccl" / "include").mkdir(parents=True)
    (root / "nvidia" / "nccl" / "lib").mkdir()
    (root / "nvidia" / "nccl" / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    (root / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    return root


def cuda_toolkit(root: Path) -> Path:
    """A CUDA home as a site's module names it: bin/nvcc, executable."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return root


def test_a_cpu_build_keeps_the_flags_it_had():
    plan = build_plan(False, Path("/nowhere"), {})
    assert plan.environment == OLD_CPU_FLAGS == CPU_BUILD and not plan.links
    check_plan(plan)


def test_the_gpu_build_takes_nccl_from_pip_and_nvcc_from_the_site(tmp_path):
    sp = pip_nccl(tmp_path / "site-packages")
    cuda = cuda_toolkit(tmp_path / "cuda-12.2")
    plan = build_plan(True, sp, {"CUDA_HOME": str(cuda), "LDFLAGS": "-L/opt/x"})
    nccl = sp / "nvidia" / "nccl"
    env = plan.environment
    assert {k: env[k] for k in OLD_CPU_FLAGS} == OLD_CPU_FLAGS
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_CUDA_HOME"] == str(cuda)
    assert (env["HOROVOD_NCCL_HOME"], env["HOROVOD_NCCL_INCLUDE"], env["HOROVOD_NCCL_LIB"]) == (
        str(nccl), str(nccl / "include"), str(nccl / "lib"))
    # pip ships no static NCCL and no unversioned libnccl.so for CMake's find_library: link the shared one,
    # found at run time through the run path.
    assert env["HOROVOD_NCCL_LINK"] == "SHARED" and env["LDFLAGS"] == f"-Wl,-rpath,{nccl / 'lib'} -L/opt/x"
    assert plan.links == ((nccl / "lib" / "libnccl.so", "libnccl.so.2"),)
    check_plan(plan)
    lines = "\n".join(plan.lines())
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in lines and "from pip's nvidia-nccl-cu12" in lines


def test_a_site_module_s_nccl_and_cuda_come_before_pip_s(tmp_path):
    sp = pip_nccl(tmp_path / "site-packages")
    cuda = cuda_toolkit(tmp_path / "cuda")
    module = {"NCCL_HOME": "/opt/nccl/2.18", "PATH": f"/usr/bin:{cuda / 'bin'}"}
    plan = build_plan(True, sp, module)
    assert plan.environment["HOROVOD_NCCL_HOME"] == "/opt/nccl/2.18" and not plan.links
    assert "HOROVOD_NCCL_LINK" not in plan.environment and "HOROVOD_NCCL_LIB" not in plan.environment
    assert plan.environment["HOROVOD_CUDA_HOME"] == str(cuda.resolve())   # nvcc on the PATH
    given = {"HOROVOD_NCCL_INCLUDE": "/i", "HOROVOD_NCCL_LIB": "/l", "NCCL_HOME": "/n", "CUDA_HOME": str(cuda)}
    kept = build_plan(True, sp, given).environment
    assert (kept["HOROVOD_NCCL_INCLUDE"], kept["HOROVOD_NCCL_LIB"]) == ("/i", "/l")
    assert "HOROVOD_NCCL_HOME" not in kept


def test_the_gpu_build_without_nvcc_or_nccl_says_what_to_load(tmp_path):
    sp = tmp_path / "site-packages"
    with pytest.raises(FirescaleError, match=r"needs a CUDA toolkit's nvcc .* ship none .*module load cuda"):
        build_plan(True, sp, {"PATH": str(tmp_path)})
    plan = build_plan(True, sp, {"CUDA_HOME": str(cuda_toolkit(tmp_path / "cuda"))})
    with pytest.raises(FirescaleError, match=r"nccl\.h does not exist; install pyproject.toml's `gpu` extra"):
        check_plan(plan)
    plan = build_plan(True, pip_nccl(sp), {"CUDA_HOME": str(tmp_path / "no-cuda")})
    with pytest.raises(FirescaleError, match=r"no-cuda/bin/nvcc is not an executable nvcc"):
        check_plan(plan)


@pytest.mark.tensorflow
def test_the_installed_cpu_build_does_not_satisfy_gpu_1():
    cpu = HorovodBuilt("0.28.1", mpi=True, gloo=True, nccl=False)
    gpu = HorovodBuilt("0.28.1", mpi=True, gloo=True, nccl=True)
    assert build_satisfied(cpu, "0.28.1", gpu=False) and not build_satisfied(cpu, "0.28.1", gpu=True)
    assert build_satisfied(gpu, "0.28.1", gpu=True) and not build_satisfied(gpu, "0.28.0", gpu=True)
    assert not build_satisfied(None, "0.28.1", gpu=False)
    here = horovod_built()   # this machine's real build: MPI and Gloo, no NCCL
    assert here is not None and here.libraries == ["MPI", "Gloo"]
    assert build_satisfied(here, here.version, gpu=False) and not build_satisfied(here, here.version, gpu=True)


@pytest.mark.tensorflow
def test_a_gpu_site_refuses_a_build_without_nccl_in_one_sentence():
    cpu = HorovodBuilt("0.28.1", mpi=True, gloo=True, nccl=False, where="/venv/horovod")
    with pytest.raises(FirescaleError) as err:
        check_build(cpu, "NCCL", whose="site ib-cluster")
    text = str(err.value)
    assert text.count(". ") == 0 and "was built without NCCL (it carries MPI, Gloo)" in text
    assert "site ib-cluster has GPUs" in text and "make setup GPU=1" in text
    assert "carries MPI, Gloo, as site local needs" in check_build(cpu, None, whose="site local")
    gpu = HorovodBuilt("0.28.1", mpi=True, gloo=True, nccl=True)
    assert "carries MPI, Gloo, NCCL" in check_build(gpu, "NCCL")
    with pytest.raises(FirescaleError, match="Horovod is not installed on"):
        check_build(None, None)
    with pytest.raises(FirescaleError, match="was built without NCCL"):   # this machine's real build
        check_build(horovod_built(), "NCCL")


def _firescale(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.tensorflow
def test_check_horovod_names_the_site():
    proc = _firescale("-m", "firescale", "site", "check-horovod", "ib-cluster")
    assert proc.returncode == 1
    assert "firescale: error: Horovod " in proc.stderr and "site ib-cluster has GPUs" in proc.stderr


@pytest.mark.tensorflow
def test_make_setup_gpu_1_plans_the_nccl_build_and_notices_the_cpu_build(tmp_path):
    """The module the Makefile runs: `plan --gpu` points into this venv's site-packages; `install --gpu`
    sees this machine's CPU build and, without a CUDA toolkit here, stops before building."""
    cuda = cuda_toolkit(tmp_path / "cuda")
    proc = _firescale("-m", "firescale.cluster.horovod_build", "plan", "--gpu", env={"CUDA_HOME": str(cuda)})
    assert proc.returncode == 0, proc.stderr
    nccl = site_packages() / "nvidia" / "nccl"
    assert f"HOROVOD_NCCL_HOME={nccl}" in proc.stdout and "HOROVOD_GPU_OPERATIONS=NCCL" in proc.stdout
    assert f"HOROVOD_CUDA_HOME={cuda}" in proc.stdout
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": "", "CUDA_PATH": "", "HOROVOD_CUDA_HOME": ""}
    proc = _firescale("-m", "firescale.cluster.horovod_build", "install", "--gpu", env=env)
    assert proc.returncode == 1
    assert "horovod 0.28.1 is built without NCCL; GPU=1 rebuilds it with NCCL" in proc.stdout
    assert "needs a CUDA toolkit's nvcc" in proc.stderr and "building horovod" not in proc.stdout
    proc = _firescale("-m", "firescale.cluster.horovod_build", "install")
    assert proc.returncode == 0 and proc.stdout == "firescale: horovod 0.28.1 with MPI and Gloo already built\n"


def _make_n(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(["make", "-n", "-C", str(REPO), "setup", f"VENV={tmp_path / 'venv'}",
                           f"PROFILE_HOME={tmp_path / 'profiles'}", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.tensorflow
def test_make_n_setup_shows_each_variant_s_steps(tmp_path):
    cpu, gpu = _make_n(tmp_path), _make_n(tmp_path, "GPU=1")
    assert "pip install -q -e '.[test,tensorflow]'" in cpu and '"tensorflow-cpu==2.15.1"' in cpu
    assert "python -m firescale.cluster.horovod_build install --version 0.28.1" in cpu
    assert "--gpu" not in cpu and "uninstall" not in cpu and "-gpu" not in cpu
    assert "pip install -q -e '.[test,tensorflow,gpu]'" in gpu and '"tensorflow==2.15.1"' in gpu
    assert "pip uninstall -q -y tensorflow-cpu" in gpu
    assert "horovod_build install --version 0.28.1 --gpu" in gpu
    assert ".firescale/stack-gpu" in gpu and ".firescale/horovod-gpu" in gpu
