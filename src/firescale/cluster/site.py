"""SiteProfile: load a site's site.yaml, apply the schema's defaults, validate, and name every error."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from firescale import frameworks
from firescale.cluster.launchers import Placement
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK
from firescale.resources import SITE_SCHEMA, schema_text
from firescale.schema_check import describe, resolve_ref, schema_errors
from firescale.yamlfile import load_yaml, written_in

SITE_FILE = "site.yaml"
_WALLTIME = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)")


@cache
def site_schema() -> dict[str, Any]:
    """The JSON Schema of site.yaml (package data)."""
    text = schema_text(SITE_SCHEMA)
    return json.loads(text)


def parse_walltime(text: str, *, where: str = "walltime") -> int:
    """Seconds in a `[D-]HH:MM:SS` walltime; `where` names the key in the error."""
    match = _WALLTIME.fullmatch(str(text))
    if not match:
        raise FirescaleError(f"{where}: {text!r} is not a walltime; use [D-]HH:MM:SS, e.g. 02:00:00")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_walltime(seconds: int) -> str:
    """`HH:MM:SS` (hours may exceed 24), as PBS and Slurm both accept."""
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass(frozen=True)
class SitePaths:
    """The site's shared-filesystem paths, with ~ and ${VAR} expanded."""

    datasets: Path
    scratch: Path
    results: Path


@dataclass(frozen=True)
class SiteProfile:
    """One cluster, validated, with the schema's defaults filled in."""

    name: str
    source: Path
    config: dict[str, Any]

    @property
    def scheduler(self) -> str:
        return self.config["scheduler"]

    @property
    def launcher(self) -> str:
        return self.config["launcher"]

    @property
    def archival(self) -> bool:
        return bool(self.config["archival"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.config["node"]["gpus"])

    @property
    def cores_per_rank(self) -> int:
        return max(1, self.config["node"]["cores"] // self.gpus_per_node)

    @property
    def max_nodes(self) -> int:
        return int(self.config["limits"]["max_nodes"])

    @property
    def max_walltime_s(self) -> int:
        return parse_walltime(self.config["limits"]["max_walltime"])

    @property
    def max_resubmits(self) -> int:
        return int(self.config["limits"]["max_resubmits"])

    @property
    def default_walltime(self) -> str:
        return str(self.config["limits"]["default_walltime"])

    @property
    def resubmit_on_node_fail(self) -> bool:
        return bool(self.config["limits"]["resubmit_on_node_fail"])

    def walltime_signal(self, framework: str = DEFAULT_FRAMEWORK) -> tuple[str, int]:
        """The signal sent before walltime ends to a job of `framework`, and how many seconds before (none on a
        site without a scheduler).  `auto` is USR1 on CPUs, and on GPUs the framework's own (the registry's
        `gpu_walltime_signal`: USR2 where NCCL runs, which may take USR1 for itself)."""
        sig = self.config["walltime_signal"]
        name = str(sig["signal"])
        if name == "auto":
            name = frameworks.framework(framework).gpu_walltime_signal if self.device_kind == "gpu" else "USR1"
        return name, int(sig["seconds_before"])

    @property
    def stall_after(self) -> float | None:
        """The site's limits.stall_after (None: from each point's prediction; 0: no stall watch)."""
        value = self.config["limits"].get("stall_after")
        return None if value is None else float(value)

    @property
    def stall_after_floor(self) -> float:
        return float(self.config["limits"]["stall_after_floor"])

    @property
    def allreduce(self) -> str:
        return self.config["allreduce"]["algorithm"]

    @property
    def device_kind(self) -> str:
        return self.config["device"]["kind"]

    @property
    def device_peak_flops(self) -> float:
        return float(self.config["device"]["peak_tflops"]) * 1e12

    def peak_flops_in(self, precision: str) -> float:
        """The device's peak FLOP/s in `precision`: its `device.precisions` entry's, else (fp32, or a precision
        the site gives no peak for) `device.peak_tflops`."""
        given = ((self.config["device"].get("precisions") or {}).get(precision) or {}).get("peak_tflops")
        return float(given) * 1e12 if given is not None else self.device_peak_flops

    def layer_profile_path(self, precision: str) -> Path | None:
        """The layer profile the site keeps for `precision` (`device.precisions.P.profile`, relative to the
        site's folder), or None."""
        given = ((self.config["device"].get("precisions") or {}).get(precision) or {}).get("profile")
        return None if given is None else self.source.parent / os.path.expanduser(str(given))

    @property
    def device_memory_bandwidth(self) -> float:
        return float(self.config["device"]["memory_bandwidth_gbs"]) * 1e9

    @property
    def device_memory(self) -> float:
        return float(self.config["device"]["memory_gb"]) * 1e9

    @property
    def link_bandwidth(self) -> float:
        """Bytes per second of one interconnect link."""
        return float(self.config["interconnect"]["bandwidth_gbits"]) * 1e9 / 8

    @property
    def link_latency(self) -> float:
        return float(self.config["interconnect"]["latency_us"]) * 1e-6

    @property
    def intra_node_link(self) -> tuple[float, float] | None:
        """Bytes per second and latency (s) between two devices of a node; None: the interconnect's for every hop."""
        intra = self.config["interconnect"].get("intra_node")
        if intra is None:
            return None
        return float(intra["bandwidth_gbits"]) * 1e9 / 8, float(intra["latency_us"]) * 1e-6

    @property
    def read_bandwidths(self) -> tuple[float, float]:
        """Bytes per second one node reads the dataset at, and the shared filesystem serves all nodes (0: not given)."""
        storage = self.config.get("storage") or {}
        return (float(storage.get("read_gbytes_per_s", 0.0)) * 1e9,
                float(storage.get("shared_read_gbytes_per_s", 0.0)) * 1e9)

    @property
    def host_to_device_bandwidth(self) -> float:
        """Bytes per second of one device's copy from host memory; 0 on CPU sites and when not given."""
        return float(self.config["device"].get("host_to_device_gbs", 0.0)) * 1e9

    @property
    def paths(self) -> SitePaths:
        expand = lambda p: Path(os.path.expandvars(os.path.expanduser(p)))  # noqa: E731
        p = self.config["paths"]
        return SitePaths(expand(p["datasets"]), expand(p["scratch"]), expand(p["results"]))

    @property
    def digest(self) -> str:
        """SHA-256 of the validated profile, for provenance."""
        blob = json.dumps(self.config, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def nodes_for(self, ranks: int, devices_per_rank: int = 1) -> int:
        """Nodes needed for `ranks` ranks of `devices_per_rank` devices each (one rank per device by default)."""
        return self.placement(ranks, devices_per_rank).nodes

    def placement(self, ranks: int, devices_per_rank: int = 1) -> Placement:
        """Where `ranks` ranks go when each drives `devices_per_rank` of a node's devices (a replica split
        over devices): as many ranks per node as its devices allow, each with the cores of its devices."""
        per_node = self.gpus_per_node // devices_per_rank
        if per_node < 1:
            raise FirescaleError(f"a rank of {devices_per_rank} devices does not fit on one node of site {self.name}, "
                                 f"which has {self.gpus_per_node} device(s) per node")
        return Placement(ranks=int(ranks), ranks_per_node=min(int(ranks), per_node),
                         cores_per_rank=self.cores_per_rank * devices_per_rank, nodes=-(-int(ranks) // per_node),
                         devices_per_rank=devices_per_rank)


def apply_defaults(schema: dict[str, Any], value: Any, root: dict[str, Any]) -> Any:
    """Fill in `default`s of object properties, recursively, without touching given values."""
    if "$ref" in schema:
        schema = resolve_ref(root, schema["$ref"])
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            sub_resolved = resolve_ref(root, sub["$ref"]) if "$ref" in sub else sub
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub_resolved, value[key], root)
    if isinstance(value, dict) and "anyOf" in schema:
        for option in schema["anyOf"]:
            if option.get("type") == "object":
                value = apply_defaults(option, value, root)
    return value


def validation_errors(config: Any, source: str | os.PathLike[str]) -> list[str]:
    """Every problem with a site profile, each one sentence naming the file and the key path."""
    schema = site_schema()
    if not isinstance(config, dict):
        return [f"{source}: a site profile must be a YAML mapping of keys, got {type(config).__name__}"]
    written = written_in(source)
    messages = [f"{source}: {describe(e, schema, written)}" for e in schema_errors(schema, config)]
    if not messages:
        messages += [f"{source}: {m}" for m in _semantic_errors(config, Path(source))]
    return messages


def _store_password(url: str | None) -> bool:
    """Whether a store URL carries a password (user:password@host)."""
    netloc = (url or "").partition("://")[2].split("/", 1)[0]
    return "@" in netloc and ":" in netloc.rpartition("@")[0]


def _semantic_errors(config: dict[str, Any], source: Path) -> Iterator[str]:
    folder = source.parent.name
    if source.name == SITE_FILE and folder and config["name"] != folder:
        yield f"key 'name': {config['name']!r} must equal the site's folder name {folder!r}"
    scheduler = config["scheduler"]
    if scheduler == "slurm" and config.get("queue"):
        yield "key 'queue': Slurm sites name a 'partition', not a 'queue'"
    if scheduler in ("pbs", "torque") and (config.get("partition") or config.get("qos")):
        yield "key 'partition'/'qos': PBS/Torque sites name a 'queue', not a Slurm partition or qos"
    if scheduler == "local" and config["limits"]["max_nodes"] != 1:
        yield "key 'limits.max_nodes': a site without a scheduler runs on one node; set it to 1"
    if config.get("vcluster") is not None and scheduler != "slurm":
        yield f"key 'vcluster': the virtual cluster runs Slurm, this site uses {scheduler!r}"
    if _store_password(config.get("results_store")):
        yield ("key 'results_store': the URL holds a password; keep it out of the profile, in PGPASSWORD or a "
               "pgpass file (~/.pgpass), and write postgresql://user@host/database")
    if config["launcher"] == "srun" and scheduler != "slurm":
        yield f"key 'launcher': srun needs the slurm scheduler, this site uses {scheduler!r}"
    exports = [o for o in config["launcher_options"] if o in ("-x", "--x") or o.startswith("-x=")]
    if config["launcher"] == "mpirun" and exports:
        yield ("key 'launcher_options': mpirun's -x cannot be used here; firescale passes every variable the job "
               "sets to all ranks itself (Open MPI's mca_base_env_list); put it under environment.variables")
    limits = config["limits"]
    if parse_walltime(limits["default_walltime"]) > parse_walltime(limits["max_walltime"]):
        yield "key 'limits.default_walltime': longer than limits.max_walltime"
    lead = config["walltime_signal"]["seconds_before"]
    for key in ("default_walltime", "max_walltime"):
        if scheduler != "local" and parse_walltime(limits[key]) <= lead:
            yield (f"key 'limits.{key}': {limits[key]} is not longer than walltime_signal.seconds_before "
                   f"({lead} s), so every job would be told to stop as soon as it starts")
    if scheduler == "slurm" and any(d.split()[0].split("=")[0] == "--requeue" for d in config["directives"]):
        yield ("key 'directives': '--requeue' is not allowed; jobs are rendered with --no-requeue because "
               "firescale resubmits them itself, from the newest snapshot and within limits.max_resubmits")
    timeouts = config["collective_timeout"]
    if 0 < timeouts["horovod_stall_shutdown_seconds"] < timeouts["horovod_stall_check_seconds"]:
        yield ("key 'collective_timeout.horovod_stall_shutdown_seconds': shorter than horovod_stall_check_seconds; "
               "Horovod shuts down only after it has checked, so give at least the check's seconds (or 0: never)")
    if config["node"]["cores"] < config["node"]["gpus"]:
        yield "key 'node.cores': fewer cores than GPUs per node; each rank needs at least one core"
    yield from _link_errors(config)


def _link_errors(config: dict[str, Any]) -> Iterator[str]:
    """The two-level link and data-path keys against the node they describe."""
    if config["interconnect"].get("intra_node") is not None and config["node"]["gpus"] < 2:
        yield ("key 'interconnect.intra_node': a node of one device has no link between two of its devices; "
               "leave the key out or give node.gpus of 2 or more")
    if "host_to_device_gbs" in config["device"] and config["device"]["kind"] == "cpu":
        yield ("key 'device.host_to_device_gbs': a CPU device computes on host memory and copies nothing; "
               "leave the key out or set device.kind to gpu")


def site_search_path() -> list[Path]:
    """Folders searched for site/<name>: ./site (the project's), then $FIRESCALE_SITE_PATH (colon-separated)."""
    paths = [Path.cwd() / "site"]
    paths += [Path(p) for p in os.environ.get("FIRESCALE_SITE_PATH", "").split(os.pathsep) if p]
    return paths


def add_site_folder(folder: str | os.PathLike[str]) -> None:
    """Search `folder` (a project's site/) first, here and in every process started from here: the
    workflow calls this with its own site/, so that the commands its rules run find the same sites."""
    rest = os.environ.get("FIRESCALE_SITE_PATH", "")
    os.environ["FIRESCALE_SITE_PATH"] = os.pathsep.join(p for p in (os.fspath(folder), rest) if p)


def find_site_file(name_or_path: str | os.PathLike[str]) -> Path:
    """The site.yaml a name or path refers to."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    if candidate.is_dir():
        if (candidate / SITE_FILE).is_file():
            return candidate / SITE_FILE
        raise FirescaleError(f"{candidate}: no {SITE_FILE} in this folder")
    name = str(name_or_path)
    searched = site_search_path()
    for folder in searched:
        if (folder / name / SITE_FILE).is_file():
            return folder / name / SITE_FILE
    known = sorted({p.parent.name for f in searched if f.is_dir() for p in f.glob(f"*/{SITE_FILE}")})
    raise FirescaleError(
        f"no site named {name!r} (looked in {', '.join(str(f) for f in searched)}); "
        f"known sites: {', '.join(known) or 'none'}"
    )


def read_site_yaml(path: Path) -> Any:
    """The site file's YAML; invalid YAML or a key given twice is an error naming the file and line."""
    return load_yaml(path, "site profile")


def check_site(name_or_path: str | os.PathLike[str]) -> tuple[Path, Any, list[str]]:
    """The site file, its config with defaults, and every problem with it (empty when valid)."""
    path = find_site_file(name_or_path)
    raw = read_site_yaml(path)
    config = apply_defaults(site_schema(), copy.deepcopy(raw), site_schema()) if isinstance(raw, dict) else raw
    return path, config, validation_errors(config, path)


def load_site(name_or_path: str | os.PathLike[str]) -> SiteProfile:
    """Load and validate a site by name (site/<name>/site.yaml) or by path; errors name file and key."""
    path, config, errors = check_site(name_or_path)
    if errors:
        more = f" (and {len(errors) - 1} more problem(s); run `firescale site lint {path}`)" if len(errors) > 1 else ""
        raise FirescaleError(errors[0] + more)
    return SiteProfile(name=config["name"], source=path.resolve(), config=config)
