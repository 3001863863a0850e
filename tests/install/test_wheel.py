"""The wheel, installed with its dependencies into a fresh virtualenv, renders and lints sites outside the checkout."""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from firescale.resources import CONFIG_SCHEMA, SITE_SCHEMA

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "site" / "golden"
pytestmark = pytest.mark.slow

# What setuptools reads to build the wheel (src/firescale/templates links to templates/).  The wheel is
# built from a copy of these alone, as from a fresh clone: an old build/ or src/firescale.egg-info in the
# checkout (its SOURCES.txt) would put back in the wheel a file that package-data no longer names.
BUILD_INPUTS = ("pyproject.toml", "README.md", "src", "templates")
BUILD_PRODUCTS = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info")
# Package files that need not ship: Python modules ship as such, the C source is compiled into the wheel.
NOT_DATA = (".py", ".pyc", ".so", ".c")

# Two sites, found the two ways a user's shell finds them: ./site/local and ib-cluster on FIRESCALE_SITE_PATH.
# Each experiment's sweep holds a point with the ranks of a golden file of tests/site/test_render.py.
EXPERIMENTS = """\
site: local
experiments:
  fashion-lenet:
    net: lenet_same
    dataset: {name: fashion-mnist, source: "idx:/usr/share/datasets/fashion-mnist"}
    solver: workflow/solvers/lenet-fashion.prototxt
    batch: {mode: total, baseline: 64}
    lr_scaling: linear
    target: {tolerance: 0.01}
    walltime: "00:20:00"
    sweep: {gpus: [2], batch: [64]}
    sites: {local: null}
  nin-imagenet:
    net: nin
    dataset: {name: ilsvrc12, source: existing}
    solver: workflow/solvers/nin-imagenet.prototxt
    batch: {mode: total, baseline: 256}
    epochs: 47
    walltime: "24:00:00"
    sweep: {gpus: [8], batch: [256]}
    sites: {ib-cluster: null}
"""
SOLVERS = ("lenet-fashion.prototxt", "nin-imagenet.prototxt")


def run(argv: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run argv; a failure shows its output."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, (f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built by the project's setuptools (no build isolation) from a clean copy."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=BUILD_PRODUCTS)
        else:
            shutil.copy2(path, source / name)
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source), "-w", str(dist)],
        timeout=600)
    (built,) = dist.glob("firescale-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv (not the project's) holding the wheel and the dependencies it declares."""
    folder = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(folder)], timeout=120)
    run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], timeout=900)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder outside the checkout: site/local, workflow/config.yaml and its solvers; beside it,
    sites/ib-cluster, for FIRESCALE_SITE_PATH."""
    outside = tmp_path_factory.mktemp("outside")
    assert not outside.resolve().is_relative_to(REPO)
    folder = outside / "project"
    shutil.copytree(REPO / "site" / "local", folder / "site" / "local")
    shutil.copytree(REPO / "site" / "ib-cluster", outside / "sites" / "ib-cluster")
    (folder / "workflow" / "solvers").mkdir(parents=True)
    for name in SOLVERS:
        shutil.copy2(REPO / "workflow" / "solvers" / name, folder / "workflow" / "solvers" / name)
    (folder / "workflow" / "config.yaml").write_text(EXPERIMENTS)
    return folder


@pytest.fixture(scope="module")
def user_env(venv, project) -> dict[str, str]:
    """A user's shell with the new virtualenv first, nothing of the checkout on PATH or the Python path,
    and the project's sibling sites/ on FIRESCALE_SITE_PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("FIRESCALE_TEMPLATES", "PYTHONPATH", "PYTHONHOME",
                                                            "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(REPO)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["FIRESCALE_SITE_PATH"] = str(project.parent / "sites")
    return env


def firescale(venv: Path, args: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The installed `firescale ARGS`, run in the project folder."""
    return run([str(venv / "bin" / "firescale"), *args], cwd=project, env=env, timeout=300)


def test_wheel_ships_the_templates_schemas_and_every_data_file(wheel):
    with zipfile.ZipFile(wheel) as whl:
        (record,) = [n for n in whl.namelist() if n.endswith(".dist-info/RECORD")]
        shipped = {line.split(",")[0] for line in whl.read(record).decode().splitlines()}
    package = REPO / "src" / "firescale"
    data = {f"firescale/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
            if p.is_file() and not p.name.endswith(NOT_DATA) and "__pycache__" not in p.parts}
    data |= {f"firescale/templates/{p.name}" for p in (REPO / "templates").iterdir() if p.is_file()}
    data |= {f"firescale/schemas/{name}" for name in (SITE_SCHEMA, CONFIG_SCHEMA)}
    missing = sorted(data - shipped)
    assert not missing, (f"the wheel's RECORD lacks {', '.join(missing)}; list them under "
                         f"[tool.setuptools.package-data] in pyproject.toml")
    assert any(re.fullmatch(r"firescale/_pixels\.cpython-.*\.so", name) for name in shipped), "no compiled pixel kernel"


def test_installed_package_runs_from_the_new_virtualenv(venv, project, user_env):
    proc = run([str(venv / "bin" / "python"), "-c", "import firescale, firescale.caffe.pixels as px; "
                "print(firescale.__file__); print(px.PIXELS_KERNEL)"], cwd=project, env=user_env, timeout=120)
    module, kernel = proc.stdout.split()
    assert Path(module).resolve().is_relative_to(venv.resolve()), module
    assert kernel == "c"


def normalized(script: str, job_name: str, run_dir: str) -> str:
    """`script` with what differs between two jobs of one site made placeholders: the job's name, its run
    folder, its walltime, the trainer's arguments and the variables that name the experiment's point."""
    text = script.replace(run_dir, "RUN_DIR").replace(job_name, "JOB_NAME")
    text = re.sub(r"^#SBATCH --time=.*$", "#SBATCH --time=WALLTIME", text, flags=re.M)
    text = re.sub(r" firescale train .* &$", " firescale train ARGS &", text, flags=re.M)
    return re.sub(r"^export FIRESCALE_(EXPERIMENT|POINT)=.*\n", "", text, flags=re.M)


@pytest.mark.parametrize("site, experiment, point, golden", [
    ("local", "fashion-lenet", "g2-b64-r0", "local-2"),
    ("ib-cluster", "nin-imagenet", "g8-b256-r0", "ib-cluster-8"),
])
def test_site_render_writes_the_golden_job_script(venv, project, user_env, site, experiment, point, golden):
    target = project / "jobs" / site / f"{point}.sh"
    firescale(venv, ["site", "render", site, "--experiment", experiment, "--point", point, "--out", str(target)],
              project, user_env)
    assert target.is_file() and os.access(target, os.X_OK)
    run(["bash", "-n", str(target)], timeout=60)
    script = target.read_text()
    job_name = re.search(r"^FIRESCALE_JOB_NAME=(\S+)$", script, flags=re.M).group(1)
    run_dir = json.loads(target.with_suffix(".json").read_text())["run_dir"]
    ranks = int(golden.rsplit("-", 1)[1])
    expected = normalized((GOLDEN / f"{golden}.sh").read_text(), f"fs-demo-g{ranks}",
                          f"/shared/firescale/results/demo/g{ranks}")
    rendered = normalized(script, job_name, run_dir)
    diff = "".join(difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True), f"{golden}.sh",
                                        "rendered by the installed firescale"))
    assert not diff, f"the job script differs from tests/site/golden/{golden}.sh beyond the job's own values:\n{diff}"


@pytest.mark.parametrize("site", ["site/local", "ib-cluster"])
def test_site_lint_passes(venv, project, user_env, site):
    out = firescale(venv, ["site", "lint", site], project, user_env).stdout
    assert "job script(s) rendered and checked with bash -n" in out and out.rstrip().endswith("site lint: OK"), out
