"""The trainer's iteration under settings of a site's allreduce knobs, grouped and overlapped, interleaved.

A knob's effect on a lone allreduce (`bench allreduce`) is not what a user feels: the cycle time moves
where the trainer's request falls in Horovod's cycle, and fusion acts on the overlapped path's many small
requests.  The PyTorch trainer's knob is the overlapped allreduce's bucket (`bucket_mb`, the variable
FIRESCALE_BUCKET_MB), which groups its gradients as DistributedDataParallel's bucket_cap_mb does.  This
benchmark runs `firescale train` itself under each setting, as the site starts its ranks, and compares
the mean iteration with the site's own setting (grouped, the trainer's default).  The settings run in
turn within each round, their order rotated and reversed from round to round, so that the machine's load
touches every setting alike.
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from firescale.cluster.horovod import KNOB_BY_KEY, horovod_environment
from firescale.cluster.ranks import SiteRanks, site_ranks
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, REGISTRY, Framework

KNOBS_FORMAT = "firescale.bench.knobs/1"
DEFAULT = "default"   # a knob value that leaves the key out: the library's own default
# The PyTorch trainer's knobs: key -> (the variable train/torch/backend.py reads, what it is).
TORCH_KNOBS = {"bucket_mb": ("FIRESCALE_BUCKET_MB", "the overlapped allreduce's gradient bucket in MiB, above 0 "
                                                    "(default 25, DistributedDataParallel's)")}


@dataclass(frozen=True)
class KnobVocabulary:
    """The knobs of one framework's allreduce (the registry's `knobs` names it): each key's meaning, the variables
    a setting of them exports, and whose default a key left out keeps."""

    name: str
    meanings: Mapping[str, str]
    environment: Callable[..., dict[str, str]]   # (knobs, *, where) -> the variables
    own: str


def torch_environment(knobs: Mapping[str, Any], *, where: str = "--knob") -> dict[str, str]:
    """The variables for the PyTorch trainer's knobs (keys left out, or None, keep the trainer's defaults)."""
    env = {}
    for key, value in knobs.items():
        if key not in TORCH_KNOBS:
            raise FirescaleError(f"{where}: unknown key {key!r}; the pytorch framework's knobs are "
                                 f"{', '.join(TORCH_KNOBS)}")
        if value is None:
            continue
        variable, meaning = TORCH_KNOBS[key]
        if isinstance(value, bool) or not float(value) > 0:
            raise FirescaleError(f"{where}.{key}: {value!r} is not allowed; it is {meaning}")
        env[variable] = f"{float(value):g}"
    return env


VOCABULARIES = {v.name: v for v in (
    KnobVocabulary("horovod", {k: knob.meaning for k, knob in KNOB_BY_KEY.items()}, horovod_environment, "Horovod"),
    KnobVocabulary("torch", {k: meaning for k, (_, meaning) in TORCH_KNOBS.items()}, torch_environment,
                   "the trainer"))}


def vocabulary(framework: str) -> KnobVocabulary:
    """The knobs `bench knobs` turns for `framework`'s allreduce."""
    return VOCABULARIES[REGISTRY[framework].knobs]


@dataclass(frozen=True)
class Setting:
    """One setting to run: the site's knobs (its `horovod:` mapping, or the PyTorch trainer's TORCH_KNOBS) with some
    keys changed, and the allreduce mode."""

    knobs: Mapping[str, Any]
    overlap: bool
    changed: tuple[tuple[str, Any], ...] = ()   # the keys this setting sets differently from the site's
    framework: str = DEFAULT_FRAMEWORK

    @property
    def chosen(self) -> Framework:
        return REGISTRY[self.framework]

    @property
    def label(self) -> str:
        knobs = ", ".join(f"{k}={_shown(v)}" for k, v in self.changed)
        return f"{knobs or 'site'}, {'overlapped' if self.overlap else 'grouped'}"

    def environment(self) -> dict[str, str]:
        return vocabulary(self.framework).environment(self.knobs)

    def site(self, site: SiteProfile) -> SiteProfile:
        """`site` with this setting's knobs as its block of them (`horovod:`); left as it is for a framework whose
        knobs are no site setting (PyTorch's)."""
        block = self.chosen.site_knobs
        return replace(site, config={**site.config, block: dict(self.knobs)}) if block else site

    def ranks(self, site: SiteProfile) -> SiteRanks:
        """How `site` starts ranks under this setting: its environment with this setting's variables."""
        ranks = site_ranks(self.site(site))
        return replace(ranks, env={**ranks.env, **self.environment()})

    @property
    def identity(self) -> tuple[Any, ...]:
        """What the ranks see of this setting: a grouped run of a framework that buckets only its overlapped
        allreduce (PyTorch's) has no bucket, so its knobs do not count."""
        bucket_only = self.chosen.overlap_bucket_mb is not None
        env = () if bucket_only and not self.overlap else tuple(sorted(self.environment().items()))
        return env, self.overlap


def _shown(value: Any) -> str:
    if value is None:
        return DEFAULT
    if isinstance(value, bool):
        return str(value).lower()
    return f"{float(value):g}"


def parse_knob(text: str, framework: str = DEFAULT_FRAMEWORK) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` of one of `framework`'s knobs (Horovod's; PyTorch's TORCH_KNOBS; `default` leaves the key
    out), checked against the knob's meaning."""
    key, sep, values = text.partition("=")
    key = key.strip()
    knobs = vocabulary(framework)
    if not sep or key not in knobs.meanings or not values.strip():
        raise FirescaleError(f"--knob {text!r}: expected KEY=VALUE[,VALUE...] with KEY one of "
                             f"{', '.join(knobs.meanings)} (VALUE 'default' keeps {knobs.own}'s own)")
    meaning = knobs.meanings[key]
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
                                     f"'{DEFAULT}'; {key} is {meaning}") from None
        # refuses a value the knob does not take
        knobs.environment({key: value}, where="--knob")
        parsed.append(value)
    return key, parsed


def knob_settings(site_knobs: Mapping[str, Any] | None, knobs: Mapping[str, Sequence[Any]],
                  overlaps: Sequence[bool], framework: str = DEFAULT_FRAMEWORK) -> list[Setting]:
    """The site's own setting (its `horovod:` mapping; the PyTorch trainer's defaults), grouped, first; then every
    combination of `knobs`' values and `overlaps`, each once (a combination that comes to the site's own, grouped,
    is the first; a PyTorch grouped run has no bucket, so its knobs come to the same run)."""
    base = {k: v for k, v in (site_knobs or {}).items() if v is not None}
    settings = [Setting(base, False, framework=framework)]
    seen = {settings[0].identity}
    for values in itertools.product(*knobs.values()):
        chosen = dict(base)
        changed = []
        for key, value in zip(knobs, values):
            chosen.pop(key, None)
            if value is not None:
                chosen[key] = value
            if base.get(key) != value:
                changed.append((key, value))
        for overlap in overlaps:
            setting = Setting(chosen, overlap, tuple(changed), framework)
            if setting.identity not in seen:
                seen.add(setting.identity)
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
        knobs = self.setting.chosen.knobs
        return {"setting": self.setting.label, "framework": self.setting.framework, knobs: dict(self.setting.knobs),
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
