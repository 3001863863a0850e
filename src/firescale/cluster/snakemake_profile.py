"""The Snakemake profile beside a site (site/<name>/config.yaml): it must choose that site, `config: [site=<name>]`."""
from __future__ import annotations

from pathlib import Path

from firescale.cluster.job_needs import Finding
from firescale.errors import FirescaleError
from firescale.yamlfile import load_yaml

PROFILE_FILE = "config.yaml"


def profile_findings(site_folder: Path, name: str) -> list[Finding]:
    """What is wrong with the profile in `site_folder` for site `name`: missing, or choosing another site
    (a copied folder keeps the site=... of the one it was copied from)."""
    path = site_folder / PROFILE_FILE
    fix = f"`config: [site={name}]`"
    if not path.is_file():
        return [Finding("warning", f"{path}: no Snakemake profile beside the site; copy one from a shipped site "
                        f"(site/ib-cluster/{PROFILE_FILE}) with {fix}")]
    try:
        profile = load_yaml(path, "Snakemake profile")
    except FirescaleError as exc:
        return [Finding("error", str(exc))]
    given = profile.get("config") if isinstance(profile, dict) else None
    if isinstance(given, dict):     # `config: {site: NAME}`
        chosen = [str(given["site"])] if "site" in given else []
    else:                           # `config: [site=NAME]`, as --config takes it
        entries = [given] if isinstance(given, str) else given if isinstance(given, list) else []
        chosen = [str(e).partition("=")[2].strip() for e in entries if str(e).partition("=")[0].strip() == "site"]
    if not chosen:
        return [Finding("error", f"{path}: key 'config': the profile chooses no site, so Snakemake would run on "
                        f"workflow/config.yaml's; add {fix}")]
    if chosen[-1] != name:
        return [Finding("error", f"{path}: key 'config': site={chosen[-1]} chooses another site, so `snakemake "
                        f"--profile {site_folder}` would run on {chosen[-1]}; set it to {fix}")]
    return []
