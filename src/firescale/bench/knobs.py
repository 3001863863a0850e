"""The trainer's iteration under settings of a site's Horovod knobs, grouped and overlapped, interleaved.

A knob's effect on a lone allreduce (`bench allreduce`) is not what a user feels: the cycle time moves
where the trainer's request falls in Horovod's cycle, and fusion acts on the overlapped path's many small
requests.  This benchmark runs `firescale train` itself under each setting, as the site starts its ranks,
and compares the mean iteration with the site's own setting (grouped, the trainer's default).  The
settings run in turn within each round, their order rotated and reversed from round to round, so that
the machine's load touches every setting alike.
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from firescale.cluster.horovod import KNOB_BY_KEY, horovod_environment
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError

KNOBS_FORMAT = "firescale.bench.knobs/1"
DEFAULT = "default"   # a knob value that leaves the key out: Horovod's own default


@dataclass(frozen=True)
class Setting:
    """One setting to run: the site's `horovod:` mapping with some keys changed, and the allreduce mode."""

    horovod: Mapping[str, Any]
    overlap: bool
    changed: tuple[tuple[str, Any], ...] = ()   # the keys this setting sets differently from the site's

    @property
    def label(self) -> str:
        knobs = ", ".join(f"{k}={_shown(v)}" for k, v in self.changed)
        return f"{knobs or 'site'}, {'overlapped' if self.overlap else 'grouped'}"

    def environment(self) -> dict[str, str]:
        return horovod_environment(self.horovod)

    def site(self, site: SiteProfile) -> SiteProfile:
        """`site` with this setting's `horovod:` mapping."""
        return replace(site, config={**site.config, "horovod": dict(self.horovod)})


def _shown(value: Any) -> str:
    if value is None:
        return DEFAULT
    if isinstance(value, bool):
        return str(value).lower()
    return f"{float(value):g}"


def parse_knob(text: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` of a Horovod knob (`default` leaves the key out), checked against the knob's meaning."""
    key, sep, values = text.partition("=")
    key = key.strip()
    knob = KNOB_BY_KEY.get(key)
    if not sep or knob is None or not values.strip():
        raise FirescaleError(f"--knob {text!r}: expected KEY=VALUE[,VALUE...] with KEY one of "
                             f"{', '.join(KNOB_BY_KEY)} (VALUE 'default' keeps Horovod's own)")
    parsed: list[Any] = []
    for raw in (v.strip() for v in values.split(",")):
        if raw == DEFAULT:
            parsed.append(None)
            continue
        value: Any
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = float(raw)
            except ValueError:
                raise FirescaleError(f"--knob {key}: {raw!r} is neither a number, true, false nor "
                                     f"'{DEFAULT}'; {key} is {knob.meaning}") from None
        horovod_environment({key: value}, where="--knob")   # refuses a value the knob does not take
        parsed.append(value)
    return key, parsed


def knob_settings(site_horovod: Mapping[str, Any] | None, knobs: Mapping[str, Sequence[Any]],
                  overlaps: Sequence[bool]) -> list[Setting]:
    """The site's own setting, grouped, first; then every combination of `knobs`' values and `overlaps`,
    each once (a combination that comes to the site's own, grouped, is the first)."""
    base = {k: v for k, v in (site_horovod or {}).items() if v is not None}
    settings = [Setting(base, False)]
    seen = {(tuple(sorted(Setting(base, False).environment().items())), False)}
    for values in itertools.product(*knobs.values()):
        horovod = dict(base)
        changed = []
        for key, value in zip(knobs, values):
            horovod.pop(key, None)
            if value is not None:
                horovod[key] = value
            if base.get(key) != value:
                changed.append((key, value))
        for overlap in overlaps:
            setting = Setting(horovod, overlap, tuple(changed))
            identity = (tuple(sorted(setting.environment().items())), overlap)
            if identity not in seen:
                seen.add(identity)
                settings.append(setting)
    return settings


@dataclass
class KnobRow:
    """One setting at one per-rank batch: the trainer's mean iteration in each round."""

    setting: Setting
    batch_per_rank: int
    iteration_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.iteration_s)

    def change_percent(self, site: KnobRow) -> float:
        """The median against the site's own setting's median, in percent of it."""
        return (self.median_s - site.median_s) / site.median_s * 100

    def clearly_faster(self, site: KnobRow) -> bool:
        """Every run of this setting shorter than every run of the site's: a lead beyond the rounds' spread."""
        return max(self.iteration_s) < min(site.iteration_s)

    def to_dict(self, site: KnobRow) -> dict[str, Any]:
        return {"setting": self.setting.label, "horovod": dict(self.setting.horovod),
                "overlap_allreduce": self.setting.overlap, "environment": self.setting.environment(),
                "batch_per_rank": self.batch_per_rank, "iteration_s": self.iteration_s,
                "median_s": self.median_s, "change_percent": self.change_percent(site),
                "clearly_faster": self.clearly_faster(site)}


def compare_knobs(run: Callable[[Setting, int, str], float], settings: Sequence[Setting],
                  batches: Sequence[int], repeats: int,
                  say: Callable[[str], None] = lambda s: None) -> dict[int, list[KnobRow]]:
    """`repeats` rounds; in each, every setting at every per-rank batch.  `run(setting, batch_per_rank, name)`
    gives one run's mean iteration in seconds.  The settings' order is rotated by one each round and
    reversed every other round.  Rows per batch, in the order of `settings` (the site's own first)."""
    if repeats < 1 or not settings or not batches or min(batches) < 1:
        raise FirescaleError(f"need repeats >= 1, a setting and per-rank batches >= 1, not {repeats}, "
                             f"{len(settings)} and {list(batches)}")
    rows = {b: [KnobRow(s, b) for s in settings] for b in batches}
    for k in range(repeats):
        order = list(range(len(settings)))
        order = order[k % len(order):] + order[:k % len(order)]
        for b in batches:
            for i in (order if k % 2 == 0 else order[::-1]):
                seconds = run(settings[i], b, f"b{b}-s{i}-{k}")
                rows[b][i].iteration_s.append(seconds)
                say(f"round {k + 1}, {b} images a rank, {settings[i].label}: {seconds * 1e3:.3f} ms")
    return rows
