"""What a calibration measures, as a stable key: the site's hardware, the probe's nodes, the net's content, the
batches a rank runs, the framework, its precision and the versions its jobs run; no path of the checkout in it."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.atomic import load_json
from firescale.errors import FirescaleError
from firescale.frameworks import REGISTRY
from firescale.model.paleo import site_process_group
from firescale.nets.zoo import is_net_file
from firescale.sweep.jobs import run_dir
from firescale.sweep.plan import SweepPlan
from firescale.sweep.records import RUN_FORMAT

# Part of every key: bump it when what a calibration job measures or how it fits changes (a new probe, another
# process group chosen by default), so that calibrations kept before stop matching.  firescale's own version does
# not change with a checkout's commits.
KEY_FORMAT = "firescale.calibration-key/1"
# The parts of a site's profile that shape what its calibration measures (the nodes, their devices and links, how
# ranks start and what the job exports to them); its paths, limits, accounts and polling do not.
MEASURED_SITE_KEYS = ("partition", "directives", "launcher", "launcher_options", "srun_mpi", "node", "device",
                      "interconnect", "storage", "allreduce", "horovod")


@dataclass(frozen=True)
class CalibrationKey:
    """The fields a calibration is kept and found by, and their digest: the name of its file in the library."""

    fields: dict[str, Any]

    @property
    def digest(self) -> str:
        """16 hex digits of the SHA-256 of the fields as key-sorted JSON."""
        text = json.dumps(self.fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """The fields a person checks, in one line: the net, the probe's ranks, the batches, the stack."""
        f, probe = self.fields, self.fields["probe"]
        ranks = ("1 rank" if probe["ranks"] == 1 else f"{probe['ranks']} ranks on {probe['nodes']} node"
                 + ("s" if probe["nodes"] > 1 else "") + f" ({probe['ranks_per_node']} a node)")
        stack = ", ".join(f"{name} {version}" for name, version in f["versions"].items() if version)
        return (f"{f['net']} on {ranks} of site {f['site']}, batch {' and '.join(map(str, f['batch_per_rank']))} a "
                f"rank, {f['framework']} {f['precision']}" + (f" ({stack})" if stack else ""))


def calibration_key(plan: SweepPlan, experiment: str) -> CalibrationKey:
    """The key of the experiment's calibration on the plan's site, from the plan and the baseline's run record (the
    versions its job ran with: the environment the jobs run from, as their rank 0 recorded it)."""
    exp = plan.experiment(experiment)
    site = plan.site
    most = max(p.ranks for p in plan.points[experiment])
    placement = site.placement(most)
    solver = plan.solver(experiment)
    options = plan.calibration_options(experiment)
    framework = plan.framework(experiment)
    names_group = REGISTRY[framework].names_process_group
    fields = {
        "format": KEY_FORMAT,
        "site": site.name,
        "site_sha256": _digest({k: site.config.get(k) for k in MEASURED_SITE_KEYS}
                               | {"variables": site.config["environment"].get("variables") or {}}),
        "probe": {"ranks": most, "nodes": placement.nodes, "ranks_per_node": placement.ranks_per_node},
        "net": net_identity(plan.net(experiment)),
        "dataset": exp["dataset"]["name"],
        "crop": exp["dataset"]["transform"].get("crop"),
        "batch_per_rank": [plan.baselines(experiment)[0].batch, plan.short_run_batch(experiment)],
        "solver": {"type": solver.type, "iter_size": solver.iter_size},
        "framework": framework,
        "precision": exp["precision"],
        # the group the runs' ranks take (auto resolved as they resolve it): an MPI group's calibration is no Gloo one's
        "process_group": site_process_group(site, exp.get("process_group", "auto")) if names_group else None,
        "probe_overlap": "--probe-overlap" in options,
        "io_record_sha256": (_file_sha256(Path(options[options.index("--io-record") + 1]))
                             if "--io-record" in options else None),
        "versions": baseline_versions(plan, experiment),
    }
    return CalibrationKey(fields)


def net_identity(net: str) -> str:
    """A built-in net's name, or a net file's content as `sha256:<hex>`: the same file anywhere is the same net."""
    return f"sha256:{_file_sha256(Path(net))}" if is_net_file(net) else net


def baseline_versions(plan: SweepPlan, experiment: str) -> dict[str, str | None]:
    """firescale's version and those of the experiment's framework and allreduce libraries (the registry's
    `stack_versions`), as the first repeat of the baseline recorded them in its run folder's result.json, which
    the calibration job fits from (None: not in its stack)."""
    path = run_dir(plan, experiment, plan.baselines(experiment)[0]) / "result.json"
    if not path.is_file():
        raise FirescaleError(f"{path}: no result of the baseline of {experiment}, whose versions key its "
                             "calibration; run the baseline first")
    record = load_json(path, "run record")
    if isinstance(record, dict) and record.get("format") == RUN_FORMAT:    # a run record around the trainer's
        record = record.get("train")
    versions = record.get("versions") if isinstance(record, dict) else None
    if not isinstance(versions, dict):
        raise FirescaleError(f"{path}: the baseline's result has no versions to key its calibration by; run the "
                             "baseline again")
    keys = ("firescale", *REGISTRY[plan.framework(experiment)].stack_versions)
    return {k: None if versions.get(k) is None else str(versions[k]) for k in keys}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise FirescaleError(f"cannot read {path} to key a calibration by it: {exc.strerror}") from None
