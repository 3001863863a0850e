"""What the Snakefile asks of the package: the site, its experiments, their points and file names."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .errors import FirescaleError
from .site import SiteProfile, load_site
from .sweep import SweepPoint, experiments_for, limit_errors, plan_sweep, solver_base_lr, sweep_walltime


@dataclass(frozen=True)
class Plan:
    """The site and, per experiment, its sweep points; refused before any job if a point exceeds a limit."""

    site: SiteProfile
    points: dict[str, list[SweepPoint]]
    config: dict[str, Any]

    @classmethod
    def build(cls, config: dict[str, Any], files: Sequence[str] = ()) -> "Plan":
        """The plan of `config`; `files` (Snakemake's config files) are read again, strictly, so that a
        key given twice there is refused (Snakemake's loader keeps the last one silently)."""
        from .sweep import validate_config
        from .yamlfile import load_yaml

        for path in files:
            load_yaml(path, "experiments file")
        config = validate_config(config)
        site = load_site(config["site"])
        points: dict[str, list[SweepPoint]] = {}
        experiments = experiments_for(config, site.name)
        if not experiments:
            raise FirescaleError(f"workflow/config.yaml: no experiment lists site {site.name!r} under its 'sites'")
        for experiment in experiments:
            plan = plan_sweep(config, experiment, site.name, solver_base_lr(config, experiment))
            errors = limit_errors(plan, site, sweep_walltime(config, experiment, site))
            if errors:
                raise FirescaleError("; ".join(errors))
            points[experiment] = plan
        return cls(site=site, points=points, config=config)

    def write_config(self, path: str | Path) -> str:
        """Write the merged, validated config (profile and --configfile overrides included) for the
        commands the rules call; rewritten only when it changed, so Snakemake sees no new mtime."""
        import yaml

        from .atomic import atomic_write_text

        path = Path(path)
        text = "# written by the workflow: the experiments as this run sees them\n" + yaml.safe_dump(self.config, sort_keys=True)
        if not path.exists() or path.read_text() != text:
            atomic_write_text(path, text)
        return str(path)

    def allreduce_measurement(self) -> Path:
        """Where a cluster's Horovod allreduce measurement goes (`bench allreduce --json`, run in a job)."""
        return Path("results") / self.site.name / "allreduce.json"

    def calibration_options(self, experiment: str) -> str:
        """Extra `predict calibrate` options.  On a site without a scheduler, a short second run at half
        the batch fits the fixed per-iteration overhead, and Horovod's allreduce timed on the sweep's most
        ranks fits the communication factor.  On a cluster both would run on the login node: there the
        communication factor comes from results/<site>/allreduce.json when someone measured it in a job."""
        import shlex

        if self.site.scheduler != "local":
            measured = self.allreduce_measurement()
            return f"--allreduce-json {shlex.quote(str(measured))}" if measured.is_file() else ""
        most = max(p.gpus for p in self.points[experiment])
        return "--short-run 300" + (f" --allreduce-probe {most}" if most > 1 else "")

    def point_names(self, experiment: str) -> list[str]:
        return [p.name for p in self.points[experiment]]

    def dataset(self, experiment: str) -> dict[str, Any]:
        return self.config["experiments"][experiment]["dataset"]

    def dataset_source(self, name: str) -> str:
        """The ingest source of the dataset called `name`."""
        for experiment in self.points:
            if self.dataset(experiment)["name"] == name:
                return self.dataset(experiment)["source"]
        raise FirescaleError(f"no experiment of site {self.site.name} uses dataset {name!r}")

    def dataset_manifest_pattern(self) -> str:
        """Where an ingested dataset's manifest lands: the site's datasets path, `{dataset}` left open."""
        return str(self.site.paths.datasets.resolve() / "{dataset}" / "manifest.json")

    def dataset_dir(self, experiment: str) -> Path:
        return (self.site.paths.datasets / self.dataset(experiment)["name"]).resolve()

    def files(self, pattern: str, experiment: str | None = None) -> list[str]:
        """`pattern` filled in for every point (of one experiment, or of all)."""
        names = [experiment] if experiment else list(self.points)
        return [pattern.format(site=self.site.name, experiment=e, point=p)
                for e in names for p in self.point_names(e)]
