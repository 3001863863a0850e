"""Which store a site's runs go to: its profile's `results_store`, else the SQLite file in its results path."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from firescale.cluster.site import check_site, load_site
from firescale.errors import FirescaleError
from firescale.store.database import STORE_FILE, site_store_url, store_url

SITES = Path(__file__).resolve().parents[2] / "site"


def _site(tmp_path, **changes):
    folder = shutil.copytree(SITES / "local", tmp_path / "mine")
    config = yaml.safe_load((folder / "site.yaml").read_text())
    config.update(name="mine", **changes)
    (folder / "site.yaml").write_text(yaml.safe_dump(config))
    return folder / "site.yaml", config


def test_the_default_store_is_one_sqlite_file_in_the_results_path(tmp_path, monkeypatch):
    path, _ = _site(tmp_path)
    monkeypatch.chdir(tmp_path)
    site = load_site(path)
    assert site_store_url(site) == f"sqlite:///{(tmp_path / '.firescale-work' / 'results' / STORE_FILE)}"
    monkeypatch.delenv("FIRESCALE_RESULTS_URL", raising=False)
    assert store_url(None, site) == site_store_url(site)
    monkeypatch.setenv("FIRESCALE_RESULTS_URL", "postgresql://me@db/results")
    assert store_url(None, site) == "postgresql://me@db/results"         # the environment over the profile
    assert store_url(str(tmp_path / "x.sqlite"), site) == f"sqlite:///{tmp_path / 'x.sqlite'}"  # --store first


def test_a_profile_names_a_centres_store_with_variables_expanded(tmp_path, monkeypatch):
    path, _ = _site(tmp_path, results_store="postgresql://${USER}@db.example.org:5433/firescale")
    monkeypatch.setenv("USER", "alice")
    assert site_store_url(load_site(path)) == "postgresql://alice@db.example.org:5433/firescale"


@pytest.mark.parametrize("url", ["postgresql://alice:s3cret@db/firescale", "mysql://alice@db/firescale",
                                 "db.example.org/firescale"])
def test_a_profile_may_not_hold_a_password_or_another_kind_of_store(tmp_path, url):
    path, _ = _site(tmp_path, results_store=url)
    _, _, errors = check_site(path)
    assert len(errors) == 1 and "results_store" in errors[0] and "s3cret" not in errors[0], errors
    with pytest.raises(FirescaleError, match="results_store"):
        load_site(path)
