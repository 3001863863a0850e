"""Provenance: git commit, package versions, site profile hash, dataset manifest, seeds, hosts, commands."""
from __future__ import annotations

import platform
import shlex
from importlib import metadata
from pathlib import Path
from typing import Any

from firescale.source import git_state
from firescale.sweep.records import RunRecord

REPORT_PACKAGES = ("firescale", "tensorflow-cpu", "tensorflow", "horovod", "numpy", "mpi4py", "h5py", "lmdb",
                   "matplotlib", "snakemake")


def package_versions(names: tuple[str, ...] = REPORT_PACKAGES) -> dict[str, str]:
    """Installed versions of the stack where the report was made; absent packages are said to be absent."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _distinct(values: list[Any]) -> list[Any]:
    return sorted({v for v in values if v not in (None, "")}, key=str)


def collect_provenance(records: list[RunRecord], *, site: dict[str, str], repo: str | Path,
                       command: list[str], net_file: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything needed to say where the numbers came from, as a JSON-ready dict; `net_file` is the path and
    sha256 of the experiment's Caffe net file now (None for a built-in net), `net_file_runs` the sha256s the runs
    recorded when they started (result.json's net_file), `test_net_file_runs` their solvers' test_net files."""
    trained = [r for r in records if r.train is not None]
    run_versions: dict[str, list[str]] = {}
    for record in trained:
        for key, value in record.train.versions.items():
            if key != "hostname":
                run_versions.setdefault(key, []).append(str(value))
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
        "versions_report": package_versions(),
        "versions_runs": {k: _distinct(v) for k, v in sorted(run_versions.items())},
        "site": site,
        "net_file": net_file,
        "net_file_runs": _distinct([t.net_file["sha256"] for t in (r.train for r in trained) if t and t.net_file]),
        "test_net_file_runs": _distinct([f"{t.test_net_file['path']}, sha256 {t.test_net_file['sha256']}"
                                         for t in (r.train for r in trained) if t and t.test_net_file]),
        "dataset_manifest_sha256": _distinct([r.train.dataset_manifest_sha256 for r in trained]),
        "datasets": _distinct([r.train.dataset for r in trained]),
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
        lines.append("versions in the runs: " + ", ".join(
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
