"""Horovod's tuning knobs: a site's `horovod:` settings, the variables a job exports for them, what a run records."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from firescale.errors import FirescaleError

if TYPE_CHECKING:  # annotations only
    from firescale.cluster.site import SiteProfile


def _mib_to_bytes(value: Any) -> str:
    return str(int(round(float(value) * 1024 * 1024)))


def _number(value: Any) -> str:
    return f"{float(value):g}"


def _flag(value: Any) -> str:
    return "1" if value else "0"


def _not_flag(value: Any) -> str:
    return "0" if value else "1"


@dataclass(frozen=True)
class Knob:
    """One site key under `horovod:` and the Horovod variable it sets (read once, at hvd.init())."""

    key: str
    variable: str
    to_env: Callable[[Any], str]
    meaning: str


# The one table: site key -> variable, shared by the job scripts, the site's launcher here and the run record.
KNOBS: tuple[Knob, ...] = (
    Knob("fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", _mib_to_bytes,
         "MiB of tensors Horovod packs into one fused allreduce (0 turns fusion off)"),
    Knob("cycle_time_ms", "HOROVOD_CYCLE_TIME", _number,
         "milliseconds the background thread waits between negotiation cycles"),
    Knob("cache_capacity", "HOROVOD_CACHE_CAPACITY", lambda v: str(int(v)),
         "entries of the response cache that skips negotiating a tensor seen before (0 turns it off)"),
    Knob("hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _flag,
         "reduce within each node first, then across nodes, then broadcast within the node"),
    Knob("group_fusion", "HOROVOD_DISABLE_GROUP_FUSION", _not_flag,
         "fuse a grouped allreduce (the trainer's one group of all gradients) with other ready tensors"),
)
KNOB_BY_KEY = {k.key: k for k in KNOBS}
VARIABLES = tuple(k.variable for k in KNOBS)
# Horovod's own cycle time when HOROVOD_CYCLE_TIME is not set: operations.cc (0.28.1) calls
# parameter_manager.SetCycleTimeMs(1) before reading the variable.
DEFAULT_CYCLE_TIME_MS = 1.0


def horovod_environment(settings: Mapping[str, Any] | None, *, where: str = "horovod") -> dict[str, str]:
    """The variables for a site's `horovod:` mapping (keys left out keep Horovod's defaults)."""
    env = {}
    for key, value in (settings or {}).items():
        knob = KNOB_BY_KEY.get(key)
        if knob is None:
            raise FirescaleError(f"{where}: unknown key {key!r}; known: {', '.join(KNOB_BY_KEY)}")
        if value is None:
            continue
        if isinstance(value, bool) != (knob.to_env in (_flag, _not_flag)) or (
                not isinstance(value, bool) and not float(value) >= 0):
            raise FirescaleError(f"{where}.{key}: {value!r} is not allowed; it is {knob.meaning}")
        env[knob.variable] = knob.to_env(value)
    return env


def site_horovod_environment(site: SiteProfile | Mapping[str, Any]) -> dict[str, str]:
    """What a site's job exports for its `horovod:` settings (a SiteProfile or a validated config mapping)."""
    config = site if isinstance(site, Mapping) else site.config
    return horovod_environment(config.get("horovod"), where=f"site {config.get('name', '?')}: horovod")


def site_cycle_time_s(site: SiteProfile | Mapping[str, Any]) -> float:
    """Seconds between Horovod's negotiation cycles on a site's ranks: its `horovod.cycle_time_ms`, else a
    HOROVOD_CYCLE_TIME among its environment variables (the site's knob wins, as the ranks see it),
    else Horovod's default."""
    config = site if isinstance(site, Mapping) else site.config
    variables = (config.get("environment") or {}).get("variables") or {}
    value = site_horovod_environment(config).get("HOROVOD_CYCLE_TIME", variables.get("HOROVOD_CYCLE_TIME"))
    if value is None:
        return DEFAULT_CYCLE_TIME_MS / 1e3
    try:
        ms = float(value)
    except (TypeError, ValueError):
        ms = -1.0
    if not (ms >= 0 and math.isfinite(ms)):
        raise FirescaleError(f"site {config.get('name', '?')}: environment variable HOROVOD_CYCLE_TIME is "
                             f"{value!r}; it must be a number of milliseconds >= 0")
    return ms / 1e3


def recorded_knobs(env: Mapping[str, str]) -> dict[str, str]:
    """The Horovod variables the ranks saw, for the run record (absent: Horovod's default)."""
    return {v: env[v] for v in VARIABLES if v in env}
