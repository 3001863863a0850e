"""Where `make setup` takes torch from, judged from pip's dry-run reports; and which backends a Python gets.

The reports in data/ are pip 26.3's own (`pip install --dry-run --report`, 2026-12-02, this kind of machine):
torch==2.13.0 for Python 3.11, where pip finds the CPU wheel on disk (/opt/wheels), and for Python 3.12, where
the only build pip reaches is PyPI's, with CUDA 13's packages.  PyTorch's CPU index is not reachable from here,
so where a test needs that index's answer, the disk's CPU build stands in for it (the same kind of plan).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from firescale.cluster.torch_install import CPU_INDEX, OPT_IN, Plan, choose, main
from firescale.errors import FirescaleError

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
DISK_CPU = json.loads((DATA / "pip-report-torch-py311-disk.json").read_text())
PYPI_CUDA = json.loads((DATA / "pip-report-torch-py312-pypi.json").read_text())


class Pip:
    """pip's answers in turn, and the extra arguments of each dry run asked for."""

    def __init__(self, *reports: dict[str, Any], probe_failure: str = "") -> None:
        self.reports, self.asked = list(reports), []
        self.probe_failure = probe_failure

    def __call__(self, extra: Sequence[str]) -> dict[str, Any]:
        self.asked.append(list(extra))
        return self.reports.pop(0)


def test_the_reports_tell_a_cpu_build_from_a_cuda_build():
    disk, pypi = Plan.from_report(DISK_CPU), Plan.from_report(PYPI_CUDA)
    assert disk.version_of("torch") == "2.13.0+cpu" and disk.cuda == []
    assert pypi.version_of("torch") == "2.13.0"
    assert {"cuda-toolkit", "nvidia-cudnn-cu13", "triton"} <= set(pypi.cuda)


def test_a_cpu_build_pip_finds_is_taken_with_one_dry_run():
    pip = Pip(DISK_CPU)
    choice = choose("torch==2.13.0", pip)
    assert choice.index is None and pip.asked == [[]]
    assert choice.line == "firescale: torch 2.13.0+cpu, a CPU build"


def test_without_a_cpu_build_at_hand_pytorchs_cpu_index_is_tried_untold():
    pip = Pip(PYPI_CUDA, DISK_CPU)
    choice = choose("torch==2.13.0", pip, python="Python 3.12.1")
    assert pip.asked[0] == [] and pip.asked[1][:2] == ["--extra-index-url", CPU_INDEX]
    assert "--retries" in pip.asked[1]      # a closed network costs one try, not pip's five
    assert choice.index == CPU_INDEX
    assert choice.line == ("firescale: no CPU build of torch==2.13.0 on this machine for Python 3.12.1; taking torch "
                           f"2.13.0+cpu from PyTorch's CPU index ({CPU_INDEX})")


def test_where_only_a_cuda_build_is_in_reach_the_set_up_stops_naming_the_opt_in():
    pip = Pip(PYPI_CUDA, PYPI_CUDA)    # the CPU index unreachable: pip plans from PyPI alone
    with pytest.raises(FirescaleError) as err:
        choose("torch==2.13.0", pip, python="Python 3.12.1")
    words = str(err.value)
    assert words.startswith("the only torch==2.13.0 pip reaches for Python 3.12.1 is a CUDA build (cuda-toolkit, ")
    assert f"make setup {OPT_IN} installs the CUDA build" in words and "docs/install.md" in words
    assert re.search(r"\.\s+[A-Z]", words) is None and "\n" not in words      # one sentence
    assert "(not reachable from here?)" in words
    pip = Pip(PYPI_CUDA, PYPI_CUDA, probe_failure="Failed to resolve 'download.pytorch.org'")
    with pytest.raises(FirescaleError, match=r"gave no CPU build \(pip: Failed to resolve 'download.pytorch.org'\);"):
        choose("torch==2.13.0", pip)


def test_the_opt_in_takes_pypis_cuda_build():
    choice = choose("torch==2.13.0", Pip(PYPI_CUDA, PYPI_CUDA), allow_cuda=True)
    assert choice.index is None and choice.line.startswith(f"firescale: {OPT_IN}: installing PyPI's CUDA build")


def test_a_named_index_that_offers_cuda_is_refused_without_a_second_guess():
    pip = Pip(PYPI_CUDA)
    with pytest.raises(FirescaleError, match=r"CUDA build of torch==2.13.0 from https://example.org/simple"):
        choose("torch==2.13.0", pip, index="https://example.org/simple")
    assert pip.asked == [["--extra-index-url", "https://example.org/simple"]]


def test_gpu_1_takes_the_build_pip_plans():
    choice = choose("torch==2.14.1", Pip(PYPI_CUDA), gpu=True)
    assert choice.index is None and "GPU=1" in choice.line


def test_a_report_without_an_install_list_is_one_sentence():
    with pytest.raises(FirescaleError, match=r"^pip's dry-run report has no install list"):
        Plan.from_report({"version": "1"})


@pytest.mark.pytorch
def test_the_command_plans_with_the_real_pip_here(tmp_path):
    """`python -m firescale.cluster.torch_install --dry-run` as the Makefile runs it, with this venv's pip: torch
    is installed here, so pip plans nothing new and nothing CUDA."""
    import torch

    code = main([f"torch=={torch.__version__.split('+')[0]}", "--report-dir", str(tmp_path), "--dry-run"])
    assert code == 0
    assert list(tmp_path.iterdir()) == []     # the dry runs' reports are removed


# ------------------------------------------------------------ which backends a Python gets (the Makefile)
def _python(version: str) -> str | None:
    """pyenv's python3.X on this machine, else one on the PATH."""
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    return str(found[-1]) if found else shutil.which(f"python{version}")


def _make_n(tmp_path: Path, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FRAMEWORKS", "MAKEFLAGS")}
    return subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), target, f"VENV={tmp_path / 'venv'}",
                           f"PROFILE_HOME={tmp_path / 'profiles'}", *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_a_python_without_tensorflow_gets_the_pytorch_backend_alone_and_says_so(tmp_path, version):
    python = _python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    proc = _make_n(tmp_path, "setup", f"PYTHON={python}")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cannot run TensorFlow 2.15 (Python 3.11 only): setting up the PyTorch" in out
    assert f"Python {version}." in out and "make setup PYTHON=/path/to/python3.11" in out
    assert "pip install -q -e '.[test]'" in out and "tensorflow" not in out.split("docs/install.md")[1]
    assert "horovod_build" not in out and "-m firescale.cluster.torch_install \"torch==2.13.0\"" in out
    test = _make_n(tmp_path, "test", f"PYTHON={python}").stdout
    assert "-m 'not tensorflow'" in test and "left out the tensorflow tier" in test
    sweep = _make_n(tmp_path, "sweep", f"PYTHON={python}").stdout
    assert "snakemake --profile local speedup_sweep --config framework=pytorch" in sweep


def test_the_default_python_keeps_both_backends(tmp_path):
    python = _python("3.11")
    assert python is not None
    out = _make_n(tmp_path, "setup", f"PYTHON={python}").stdout
    assert "PyTorch backend alone" not in out and "'.[test,tensorflow]'" in out and "horovod_build install" in out
    test = _make_n(tmp_path, "test", f"PYTHON={python}").stdout
    assert "not tensorflow" not in test and "left out" not in test
    assert "--config framework" not in _make_n(tmp_path, "sweep", f"PYTHON={python}").stdout


def test_frameworks_given_keeps_the_python_check(tmp_path):
    """FRAMEWORKS given is obeyed as before: TensorFlow asked of a Python 3.12 stops in the check, in words."""
    python = _python("3.12")
    if python is None:
        pytest.skip("no Python 3.12 on this machine")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), f"{venv}/bin/python", f"VENV={venv}",
                           f"PYTHON={python}", "FRAMEWORKS=tensorflow pytorch"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert f"firescale: Python 3.11 (TensorFlow 2.15) is required, and {python} is Python 3.12" in proc.stdout
    assert not venv.exists()
