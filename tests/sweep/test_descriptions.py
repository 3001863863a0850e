"""What each rule depends on: one experiment's file, one point's description, paths from the project folder."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from firescale.sweep.descriptions import EXPERIMENT_FILE, POINTS_FOLDER, write_descriptions
from firescale.sweep.plan import SweepPlan, load_plan

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
EXPERIMENT = "fashion-lenet"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder (one holding workflow/config.yaml) as the working directory."""
    shutil.copytree(REPO / "workflow", tmp_path / "workflow")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(config: dict, base: Path) -> SweepPlan:
    return SweepPlan.build({**config, "site": "local"}, base=base)


def _times(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*.yaml")}


def test_a_new_point_or_experiment_leaves_every_other_description_as_it_was(project):
    results = project / "results" / "local"
    write_descriptions(_plan(CONFIG, project), results)
    points = results / EXPERIMENT / POINTS_FOLDER
    before = _times(points)
    assert {p.stem for p in before} == {p.name for p in _plan(CONFIG, project).points[EXPERIMENT]}
    # another experiment beside it, and one more GPU count in its own sweep (2 cores here: 1 GPU at batch 32)
    more = copy.deepcopy(CONFIG)
    more["experiments"]["fashion-copy"] = copy.deepcopy(more["experiments"][EXPERIMENT])
    more["experiments"][EXPERIMENT]["sweep"]["batch"].append(32)
    write_descriptions(_plan(more, project), results)
    after = _times(points)
    assert {p: after[p] for p in before} == before            # untouched: the same text is never rewritten
    assert sorted(p.stem for p in set(after) - set(before)) == ["g2-b32-r0", "g2-b32-r1", "g2-b32-r2"]
    assert (results / "fashion-copy" / EXPERIMENT_FILE).is_file()
    # the experiment's own file changed (its points did); the copy's holds the copy alone
    own = yaml.safe_load((results / "fashion-copy" / EXPERIMENT_FILE).read_text())
    assert list(own["experiments"]) == ["fashion-copy"] and own["site"] == "local"


def test_what_a_points_job_reads_changes_its_description(project):
    results = project / "results" / "local"
    write_descriptions(_plan(CONFIG, project), results)
    baseline = results / EXPERIMENT / POINTS_FOLDER / "baseline.yaml"
    text = baseline.read_text()
    # the solver file's content, not only its name
    solver = project / CONFIG["experiments"][EXPERIMENT]["solver"]
    solver.write_text(solver.read_text() + "\n# edited\n")
    write_descriptions(_plan(CONFIG, project), results)
    assert baseline.read_text() != text
    text = baseline.read_text()
    # a setting every run reads (the framework)
    changed = copy.deepcopy(CONFIG)
    changed["experiments"][EXPERIMENT]["framework"] = "pytorch"
    write_descriptions(_plan(changed, project), results)
    assert baseline.read_text() != text and "framework: pytorch" in baseline.read_text()
    # the description an experiment gives itself is read by no run, nor whether it is calibrated
    described = copy.deepcopy(changed)
    described["experiments"][EXPERIMENT]["description"] = "the same runs, described anew"
    described["experiments"][EXPERIMENT]["calibrate"] = False
    text = baseline.read_text()
    write_descriptions(_plan(described, project), results)
    assert baseline.read_text() == text


def test_the_files_name_the_projects_paths_relative_and_read_back_the_same(project):
    results = project / "results" / "local"
    files = write_descriptions(_plan(CONFIG, project), results)
    text = Path(files[EXPERIMENT]).read_text()
    assert str(project) not in text and f"solver: {CONFIG['experiments'][EXPERIMENT]['solver']}" in text
    again = load_plan("local", files[EXPERIMENT], experiments=[EXPERIMENT])
    solver = CONFIG["experiments"][EXPERIMENT]["solver"]
    assert again.resolve(again.experiment(EXPERIMENT)["solver"]) == project / solver
    assert again.points[EXPERIMENT] == _plan(CONFIG, project).points[EXPERIMENT]


def test_an_experiments_file_outside_workflow_reads_its_paths_from_the_project_folder(project):
    """`--config mine/c.yaml` reads `workflow/solvers/...` from the project, as Snakemake's --configfile does."""
    mine = project / "mine"
    mine.mkdir()
    config = {**copy.deepcopy(CONFIG), "site": "local"}
    (mine / "c.yaml").write_text(yaml.safe_dump(config))
    plan = load_plan("local", mine / "c.yaml", experiments=[EXPERIMENT])
    assert plan.base == project
    assert plan.resolve(config["experiments"][EXPERIMENT]["solver"]).is_file()
