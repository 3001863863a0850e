"""Provenance: git commit, package versions, site profile hash, dataset manifest, seeds, hosts, commands."""
from __future__ import annotations

import platform
import shlex
from importlib import metadata
from pathlib import Path
from typing import Any

from firescale.frameworks import REGISTRY
from firescale.results import TrainResult
from firescale.source import git_state
from firescale.sweep.records import RunRecord

# What makes the report: reads the records, computes the tables, draws the figures.
REPORT_PACKAGES = ("firescale", "numpy", "matplotlib")
# A run records the packages it trained with by their module's name (result.json's versions); the distributions
# that give each module.  Where the report is made, only those the runs recorded are looked up.
RUN_PACKAGES = {module: given for f in REGISTRY.values() for module, given in f.distributions}
# Versions keys whose value follows from a run's ranks (one rank sums no gradients, so it has no process group):
# runs of one rank and runs of several are compared each among themselves.
BY_RANKS = ("process_group",)
ONE_RANK, SEVERAL_RANKS = "one rank", "several ranks"


def _installed(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def package_versions(used: tuple[str, ...] = ()) -> dict[str, str]:
    """Versions where the report is made: Python, the report's own packages, and those of the modules the runs
    recorded (`used`, RUN_PACKAGES' keys) that are installed here; a package neither uses is not named."""
    out = {"python": platform.python_version()}
    for name in (*REPORT_PACKAGES, *(m for m in RUN_PACKAGES if m in used)):
        version = _installed(RUN_PACKAGES.get(name, (name,)))
        if version is not None:
            out[name] = version
    return out


def _distinct(values: list[Any]) -> list[Any]:
    return sorted({v for v in values if v not in (None, "")}, key=str)


def _run_versions(trains: list[TrainResult]) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """The versions the runs recorded, key -> distinct values (hostnames and unrecorded values left out), and for
    the keys of BY_RANKS the same split into runs of one rank and runs of several."""
    values: dict[str, list[str]] = {}
    by_ranks: dict[str, dict[str, list[str]]] = {}
    for train in trains:
        kind = ONE_RANK if train.ranks == 1 else SEVERAL_RANKS
        for key, value in train.versions.items():
            if key == "hostname" or value in (None, ""):
                continue
            values.setdefault(key, []).append(str(value))
            if key in BY_RANKS:
                by_ranks.setdefault(key, {}).setdefault(kind, []).append(str(value))
    return ({k: _distinct(v) for k, v in sorted(values.items())},
            {k: {kind: _distinct(v[kind]) for kind in (SEVERAL_RANKS, ONE_RANK) if kind in v}
             for k, v in sorted(by_ranks.items())})


def collect_provenance(records: list[RunRecord], *, site: dict[str, str], repo: str | Path,
                       command: list[str], net_file: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything needed to say where the numbers came from, as a JSON-ready dict; `net_file` is the path and
    sha256 of the experiment's Caffe net file now (None for a built-in net), `net_file_runs` the sha256s the runs
    recorded when they started (result.json's net_file), `test_net_file_runs` their solvers' test_net files."""
    trained = [r for r in records if r.train is not None]
    run_versions, by_ranks = _run_versions([r.train for r in trained if r.train is not None])
    runs = []
    for record in sorted(records, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat)):
        train = record.train
        runs.append({
            "point": record.point, "outcome": record.outcome,
            "seed": train.seed if train else None, "data_seed": train.data_seed if train else None,
            "hostnames": sorted(set(train.hostnames)) if train else [],
            "command": shlex.join(train.command) if train and train.command else "",
            "job_ids": [str(s.get("job_id")) for s in record.submissions if s.get("job_id") is not None],
            "queue_s": record.queue_s,
            "net_file_sha256": train.net_file["sha256"] if train and train.net_file else None,
            "read_limit_mbs": train.read_limit_mbs if train else None,
        })
    return {
        "git": git_state(repo),
        "report_command": shlex.join(command),
        "versions_report": package_versions(tuple(run_versions)),
        "versions_runs": run_versions,
        "versions_runs_by_ranks": by_ranks,
        "site": site,
        "net_file": net_file,
        "net_file_runs": _distinct([t.net_file["sha256"] for t in (r.train for r in trained) if t and t.net_file]),
        "test_net_file_runs": _distinct([f"{t.test_net_file['path']}, sha256 {t.test_net_file['sha256']}"
                                         for t in (r.train for r in trained) if t and t.test_net_file]),
        "dataset_manifest_sha256": _distinct([t.dataset_manifest_sha256 for t in (r.train for r in trained) if t]),
        "datasets": _distinct([t.dataset for t in (r.train for r in trained) if t]),
        "runs": runs,
    }


def _net_file_runs(prov: dict[str, Any]) -> list[str]:
    """The net file's sha256 as the runs recorded it, against the file read for the report."""
    hashes, now = prov.get("net_file_runs") or [], (prov.get("net_file") or {}).get("sha256")
    if len(hashes) > 1:
        return [f"net file sha256 DIFFERS between runs: {', '.join(hashes)}"]
    if not hashes:
        return []
    same = "" if now is None else (" (the same file)" if hashes[0] == now else
                                   " (the file has CHANGED since the runs)")
    return [f"net file sha256 in the runs: {hashes[0]}{same}"]


def _version_text(key: str, kinds: dict[str, list[str]]) -> str:
    """'process_group gloo (several ranks), none (one rank)': DIFFER only where runs of one kind differ."""
    differ = [kind for kind, values in kinds.items() if len(values) > 1]
    text = ", ".join(f"{' / '.join(values)} ({kind})" for kind, values in kinds.items())
    return f"{key} {text}" + (f" (DIFFER between runs of {' and of '.join(differ)})" if differ else "")


def provenance_lines(prov: dict[str, Any]) -> list[str]:
    """The provenance as short sentences for Markdown, HTML and LaTeX comments."""
    git = prov["git"]
    dirty = {True: " (with uncommitted changes)", False: " (clean)", None: ""}[git["dirty"]]
    lines = [f"git commit: {git['commit']}{dirty}"]
    site = prov["site"]
    lines.append(f"site profile: {site.get('name', '?')} from {site.get('source', '?')}, "
                 f"sha256 {site.get('sha256', '?')}")
    if prov.get("net_file"):
        lines.append(f"net file: {prov['net_file']['path']}, sha256 {prov['net_file']['sha256']} "
                     f"(read when this report was made)")
    lines.extend(_net_file_runs(prov))
    tests = prov.get("test_net_file_runs") or []
    if tests:
        lines.append(("test net file DIFFERS between runs: " if len(tests) > 1 else "test net file in the runs: ")
                     + "; ".join(tests))
    manifests = prov["dataset_manifest_sha256"]
    if len(manifests) > 1:
        lines.append(f"dataset manifest sha256 DIFFERS between runs: {', '.join(manifests)}")
    else:
        lines.append(f"dataset manifest sha256: {manifests[0] if manifests else 'none recorded'}"
                     + (f" ({', '.join(prov['datasets'])})" if prov["datasets"] else ""))
    runv = prov["versions_runs"]
    if runv:
        by_ranks = prov.get("versions_runs_by_ranks", {})
        lines.append("versions in the runs: " + ", ".join(
            _version_text(k, by_ranks[k]) if k in by_ranks else
            f"{k} {' / '.join(v)}" + (" (DIFFER between runs)" if len(v) > 1 else "") for k, v in runv.items()))
    lines.append("versions making this report: " + ", ".join(f"{k} {v}" for k, v in prov["versions_report"].items()))
    for run in prov["runs"]:
        if run["outcome"] != "succeeded":
            jobs = f", jobs {', '.join(run['job_ids'])}" if run["job_ids"] else ""
            lines.append(f"{run['point']}: {run['outcome']}{jobs}")
            continue
        queue = f", queued {run['queue_s']:.1f} s" if isinstance(run["queue_s"], (int, float)) else ""
        lines.append(f"{run['point']}: seed {run['seed']}, data seed {run['data_seed']}, hosts "
                     f"{', '.join(run['hostnames']) or 'none recorded'}"
                     + (f", jobs {', '.join(run['job_ids'])}" if run["job_ids"] else "") + queue
                     + (f", reads limited to {run['read_limit_mbs']:g} MB/s per rank (--read-limit-mbs)"
                        if run.get("read_limit_mbs") else "")
                     + (f"; command: {run['command']}" if run["command"] else ""))
    lines.append(f"report command: {prov['report_command']}")
    return lines
