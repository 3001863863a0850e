"""Fuzzing the readers of YAML a user writes: site profiles (as `site lint` reads them: the schema, what jobs
need, the job scripts rendered, and the platform the model predicts on) and experiments files (as a sweep
plans them on the local site, and predicts the points).  Inputs are the repository's own sites and experiments
files, their text or their parsed tree changed."""
from __future__ import annotations

import os
import shutil

import pytest
import yaml
from fuzzing import REPO, budget, one_sentence, read_or_refuse, scratch_file, shipped, trial
from hypothesis import given
from hypothesis import strategies as st
from mutate import mutated_text, mutated_tree, tree_words

from firescale.errors import FirescaleError

pytestmark = pytest.mark.fuzz

SITE_FILES = shipped("site/*/site.yaml")
SITES = {p.parent.name: p.read_text() for p in SITE_FILES}
SITE_TREES = {name: yaml.safe_load(text) for name, text in SITES.items()}


def _schema_words() -> list[str]:
    from firescale.cluster.site import site_schema

    return tree_words(site_schema())


SITE_WORDS = sorted({w for t in SITE_TREES.values() for w in tree_words(t)} | set(_schema_words()))

CONFIG_FILES = shipped("workflow/config.yaml", "workflow/examples/*.yaml", "tests/workflow/*.yaml",
                       "tests/report/data/config.yaml")
CONFIGS = {f"{p.parent.name}-{p.name}": p.read_text() for p in CONFIG_FILES}
CONFIG_TREES = {name: yaml.safe_load(text) for name, text in CONFIGS.items()}
CONFIG_WORDS = sorted({w for t in CONFIG_TREES.values() for w in tree_words(t)})


# ---------------------------------------------------------------- site profiles

def lint(name: str, text: str) -> None:
    """The site as `firescale site lint` checks it (from a folder without an experiments file: the site alone),
    then as the model reads it: its platform, and a 2-rank LeNet point predicted on it."""
    from firescale.cluster.site import check_site, load_site
    from firescale.commands.site_lint import lint_site
    from firescale.model.paleo import platform_from_site, predict_point
    from firescale.nets.zoo import get_net

    path = scratch_file("site.yaml", text, f"sites/{name}")
    shutil.copy(REPO / "site" / name / "config.yaml", path.with_name("config.yaml"))
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with trial("site profile"):
            checked = read_or_refuse(lambda: check_site(path), path)
            if checked is None:
                return
            for line in checked[2]:
                assert line and "\n" not in line.strip() and str(path) in line, line
            if checked[2]:   # the schema's problems and the checks beside it: load_site stops at the first
                with pytest.raises(FirescaleError) as caught:
                    load_site(path)
                one_sentence(caught.value, path)
                return
            site = load_site(path)
            found = read_or_refuse(lambda: lint_site(str(path)), path)
            for line in (found[0] + found[1]) if found else ():
                assert line and "\n" not in line.strip(), line
            platform = read_or_refuse(lambda: platform_from_site(site), path)
            if platform is not None:
                spec = get_net("lenet_same", num_classes=10, input_shape=(28, 28, 1))
                read_or_refuse(lambda: predict_point(platform, spec, 2, 64), path)
    finally:
        os.chdir(here)


@budget(60)
@given(st.data())
def test_a_site_profiles_text_changed_lints_or_stops_in_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(SITES)))
    lint(name, data.draw(mutated_text(SITES[name], SITE_WORDS)))


@budget(100)
@given(st.data())
def test_a_site_profiles_keys_changed_lint_or_stop_in_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(SITES)))
    lint(name, yaml.safe_dump(data.draw(mutated_tree(SITE_TREES[name], SITE_WORDS))))


# ---------------------------------------------------------------- experiments files

def plan(name: str, text: str) -> None:
    """The experiments file read and validated, then planned on the local site from the repository (its solver
    files and nets), and each experiment's points predicted."""
    from firescale.cluster.site import load_site
    from firescale.predict.experiment import predict_experiment
    from firescale.sweep.config import check_workflow_config, load_config
    from firescale.sweep.plan import SweepPlan
    from firescale.yamlfile import load_yaml

    path = scratch_file("config.yaml", text, f"experiments/{name}")
    site = load_site(REPO / "site" / "local" / "site.yaml")
    with trial("experiments file"):
        raw = read_or_refuse(lambda: load_yaml(path, "experiments file"), path)
        if isinstance(raw, dict):   # as Snakemake's merged config reaches the workflow's check
            read_or_refuse(lambda: check_workflow_config(raw, [path]), path)
        config = read_or_refuse(lambda: load_config(path, {"site": "local"}), path)
        if config is None:
            return
        sweep = read_or_refuse(lambda: SweepPlan.build(config, site, source=path, base=REPO, check_limits=False),
                               [path, "experiment"])
        for experiment in (sweep.points if sweep is not None else ()):
            read_or_refuse(lambda e=experiment: predict_experiment(sweep, e, dataset_size=60_000), [path, experiment])


@budget(50)
@given(st.data())
def test_an_experiments_files_text_changed_plans_or_stops_in_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(CONFIGS)))
    plan(name, data.draw(mutated_text(CONFIGS[name], CONFIG_WORDS)))


@budget(80)
@given(st.data())
def test_an_experiments_files_keys_changed_plan_or_stop_in_one_sentence(data):
    name = data.draw(st.sampled_from(sorted(CONFIGS)))
    plan(name, yaml.safe_dump(data.draw(mutated_tree(CONFIG_TREES[name], CONFIG_WORDS))))


def test_the_shipped_sites_and_experiments_lint_and_plan():
    for name, text in SITES.items():
        lint(name, text)
    for name, text in CONFIGS.items():
        plan(name, text)
