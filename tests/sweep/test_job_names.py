"""Job names: one per experiment and point, within what each scheduler keeps of a name, readable in its queue."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler
from firescale.sweep.jobs import JOB_NAME_LENGTH, calibration_job, job_for_point, job_name
from firescale.sweep.plan import SweepPlan

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
# What the scheduler is told the job is called, as each template writes it.
DIRECTIVE = re.compile(r"^(?:#SBATCH --job-name=|#PBS -N )(\S+)$|^FIRESCALE_JOB_NAME=(\S+)$", re.M)


def with_twin(experiment: str, twin: str, **changes) -> dict:
    """The shipped experiments file with a copy of `experiment` named `twin` (its name begins with the other's)."""
    config = copy.deepcopy(CONFIG)
    config["experiments"][twin] = {**copy.deepcopy(config["experiments"][experiment]), **changes}
    return config


def rendered_names(site: str, config: dict, experiments: list[str]) -> dict[tuple[str, str], set[str]]:
    """Each job's (experiment, point or calibration) names in its rendered script: the directive's and the
    job's own, which must be one."""
    plan = SweepPlan.build({**config, "site": site}, experiments=experiments)
    out = {}
    for experiment in experiments:
        jobs = {p.name: job_for_point(plan, experiment, p) for p in plan.points[experiment]}
        jobs["calibration"] = calibration_job(plan, experiment)
        for point, job in jobs.items():
            script = render_job_script(plan.site, job)
            out[experiment, point] = {a or b for a, b in DIRECTIVE.findall(script)}
    return out


@pytest.mark.parametrize("site, experiment, twin, changes", [
    ("local", "fashion-lenet", "fashion-lenet-pt", {"framework": "pytorch"}),    # the pair
    ("ib-cluster", "nin-imagenet", "nin-imagenet-pt", {"framework": "pytorch"}),    # Slurm
    ("titan", "nin-imagenet", "nin-imagenet-2", {}),                             # Torque: 15 characters
])
def test_two_experiments_whose_names_share_a_beginning_render_distinct_job_names(site, experiment, twin, changes):
    names = rendered_names(site, with_twin(experiment, twin, **changes), [experiment, twin])
    limit = min(get_scheduler(yaml.safe_load((REPO / "site" / site / "site.yaml").read_text())["scheduler"])
                .name_length or JOB_NAME_LENGTH, JOB_NAME_LENGTH)
    for job, found in names.items():
        assert len(found) == 1, f"{job}: the script names the job {found}"  # nothing cut by the scheduler's line
        assert len(next(iter(found))) <= limit, found
    every = [next(iter(found)) for found in names.values()]
    assert len(set(every)) == len(every), sorted(every)
    assert len(names) >= 8                          # both experiments' points and calibrations
    if site == "local":
        assert names["fashion-lenet", "g2-b64-r0"] == {"fs-fashion-lenet-67b7-g2-b64-r0"}
        assert names["fashion-lenet-pt", "g2-b64-r0"] == {"fs-fashion-lenet-pt-b40c-g2-b64-r0"}
    if site == "titan":
        assert limit == 15


def test_a_name_keeps_the_experiments_tag_and_the_point_as_the_limit_shrinks():
    full = job_name("fashion-lenet-pt", "g16-b1024-r0")
    assert full == "fs-fashion-lenet-pt-b40c-g16-b1024-r0"
    assert job_name("fashion-lenet-pt", "g16-b1024-r0", 29) == "fs-fashion-b40c-g16-b1024-r0"
    assert job_name("fashion-lenet-pt", "g16-b1024-r0", 21) == "fs-b40c-g16-b1024-r0"   # the stem left out
    # Torque's 15: the point's beginning and a tag of its own, so that repeats and points stay apart
    torque = {job_name("fashion-lenet-pt", f"g16-b{b}-r{r}", 15) for b in (256, 1024) for r in range(3)}
    assert len(torque) == 6 and all(len(n) <= 15 and n.startswith("fs-b40c-g1") for n in torque)
    # a batch schedule's '+' is no letter a scheduler takes
    assert job_name("digits", "g1-b8+16at200-r0") == "fs-digits-cc6b-g1-b8_16at200-r0"
