"""The sweep plan: fixed-epoch budgets, the learning rate as an axis, repeats, warm-up, and bad input."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from firescale.errors import FirescaleError
from firescale.sweep.descriptions import write_config
from firescale.sweep.jobs import train_command
from firescale.sweep.plan import SweepPlan

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
ILSVRC12 = 1_281_167


def plan(site: str, config: dict | None = None) -> SweepPlan:
    return SweepPlan.build({**(config or CONFIG), "site": site})


def sets(argv: list[str]) -> dict[str, str]:
    """The `--set key=value` options of a train command."""
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")


def test_nin_at_batch_1024_has_a_quarter_of_the_iterations_and_drops_its_rate_at_the_same_epochs():
    p = plan("titan")
    base, big = p.point("nin-imagenet", "baseline"), p.point("nin-imagenet", "g32-b1024-r0")
    b, s = sets(train_command(p, "nin-imagenet", base)), sets(train_command(p, "nin-imagenet", big))
    assert int(b["max_iter"]) == round(47 * ILSVRC12 / 256)         # the experiment's 47 epochs
    assert int(s["max_iter"]) == round(47 * ILSVRC12 / 1024) == pytest.approx(int(b["max_iter"]) / 4, abs=1)
    assert "stepsize" not in b and int(s["stepsize"]) == 100000 // 4   # 10x drops at the same epochs
    assert 100000 * 256 == int(s["stepsize"]) * 1024
    assert int(s["test_interval"]) == 5000 // 4 and s["base_lr"] == "0.04"


def test_googlenet_searches_five_rates_at_batch_1024_for_72_epochs():
    p = plan("titan")
    search = p.lr_search("googlenet-imagenet")
    assert [x.name for x in search] == [f"g32-b1024-lr{lr}-r0" for lr in ("0.02", "0.04", "0.08", "0.16", "0.32")]
    names = [x.name for x in p.points["googlenet-imagenet"]]
    assert len(set(names)) == 7 and names[-1] == "g128-b1024-lr0.08-r0"   # distinct names, folders, records
    base = p.point("googlenet-imagenet", "baseline")
    assert (base.batch, base.lr, base.epochs) == (32, 0.01, 64)
    b = sets(train_command(p, "googlenet-imagenet", base))
    s = sets(train_command(p, "googlenet-imagenet", search[2]))
    assert int(b["max_iter"]) == round(64 * ILSVRC12 / 32) and int(s["max_iter"]) == round(72 * ILSVRC12 / 1024)
    assert s["base_lr"] == "0.08" and "power" not in s               # poly follows max_iter by itself
    assert p.budget("googlenet-imagenet", search[2]).epochs == pytest.approx(72, abs=1e-3)


def test_repeats_default_to_three_on_local_and_the_baseline_repeats_too():
    config = copy.deepcopy(CONFIG)
    for exp in config["experiments"].values():
        exp.pop("repeats", None)
    local = plan("local", config)
    names = [x.name for x in local.points["fashion-lenet"]]
    assert names[:3] == ["baseline", "baseline-r1", "baseline-r2"]
    assert names[3:] == ["g2-b64-r0", "g2-b64-r1", "g2-b64-r2", "g2-b128-r0", "g2-b128-r1", "g2-b128-r2"]
    argv = train_command(local, "fashion-lenet", local.point("fashion-lenet", "g2-b64-r1"))
    assert "--target-from" not in argv and "--target" not in argv   # every run trains its whole budget
    seeds = {x.name: train_command(local, "fashion-lenet", x) for x in local.points["fashion-lenet"]}
    seeds = {name: argv[argv.index("--seed") + 1] for name, argv in seeds.items()}
    assert seeds["baseline"] == seeds["g2-b64-r0"] == "1" and seeds["baseline-r2"] == seeds["g2-b64-r2"] == "3"
    assert [x.name for x in plan("titan", config).points["nin-imagenet"]][0:2] == ["baseline", "g32-b256-r0"]


def test_the_default_sweeps_larger_batch_trains_the_same_epochs_at_twice_the_rate():
    local = plan("local")
    s = sets(train_command(local, "fashion-lenet", local.point("fashion-lenet", "g2-b128-r0")))
    # half the iterations; evaluations at the same epochs (235 / 2 rounds up: never more often than the baseline)
    assert (s["base_lr"], s["max_iter"], s["test_interval"]) == ("0.02", "234", "118")
    assert "max_iter" not in sets(train_command(local, "fashion-lenet", local.point("fashion-lenet", "g2-b64-r0")))


def test_a_warm_up_starts_from_the_baselines_rate():
    config = copy.deepcopy(CONFIG)
    config["experiments"]["nin-imagenet"]["warmup_iters"] = 500
    p = plan("titan", config)
    argv = train_command(p, "nin-imagenet", p.point("nin-imagenet", "g32-b1024-r0"))
    assert argv[argv.index("--warmup-iters") + 1] == "500" and argv[argv.index("--warmup-start-lr") + 1] == "0.01"
    assert sets(argv)["base_lr"] == "0.04"


def _googlenet_with(**sweep) -> dict:
    config = copy.deepcopy(CONFIG)
    config["experiments"]["googlenet-imagenet"]["sweep"].update(sweep)
    return config


@pytest.mark.parametrize("config, message", [
    (_googlenet_with(lr=[0.02, 0.08, 0.02]),
     "experiment googlenet-imagenet: key 'sweep.lr' lists 0.02 twice; list each learning rate once"),
    (_googlenet_with(lr=[0.02, -0.08]),
     "experiment googlenet-imagenet: key 'sweep.lr[1]' is -0.08; a learning rate must be positive"),
    (_googlenet_with(points=[{"gpus": 128, "batch": 1024, "lr": 0}]),
     "experiment googlenet-imagenet: key 'sweep.points[0].lr' is 0; a learning rate must be positive"),
    (_googlenet_with(epochs=0),
     "experiment googlenet-imagenet: key 'sweep.epochs' is 0; epochs must be positive"),
    (_googlenet_with(batch=[1000], gpus=[32]),
     "experiment googlenet-imagenet: key 'sweep.batch' asks for a total batch of 1000 on 32 GPUs"),
])
def test_bad_sweeps_are_one_sentence_naming_the_experiment_and_key(config, message):
    with pytest.raises(FirescaleError) as info:
        plan("titan", config)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_negative_experiment_epochs_and_a_site_override_name_their_keys():
    config = copy.deepcopy(CONFIG)
    config["experiments"]["nin-imagenet"]["epochs"] = -47
    with pytest.raises(FirescaleError, match="experiment nin-imagenet: key 'epochs' is -47; epochs must be positive"):
        plan("titan", config)
    config = copy.deepcopy(CONFIG)
    config["experiments"]["nin-imagenet"]["sites"]["ib-cluster"]["batch"] = [256, 1000]
    with pytest.raises(FirescaleError, match="key 'sites.ib-cluster.batch' asks for a total batch of 1000 on 16 GPUs"):
        plan("ib-cluster", config)


def test_relative_paths_are_read_from_the_project_folder_and_stay_so_in_the_workflows_copy(tmp_path, monkeypatch):
    # The experiments file names its solver relative to the project (the folder holding workflow/); the copy
    # the workflow writes for its commands lies in results/<site>/ and must still name the same file.
    from firescale.sweep.plan import load_plan

    monkeypatch.chdir(tmp_path)   # neither the project nor a ./workflow/config.yaml here
    original = load_plan("local", REPO / "workflow" / "config.yaml", experiments=["fashion-lenet"])
    solver = REPO / CONFIG["experiments"]["fashion-lenet"]["solver"]
    assert original.base == REPO and original.resolve(CONFIG["experiments"]["fashion-lenet"]["solver"]) == solver
    copy_file = write_config(original, tmp_path / "results" / "local" / "experiments.yaml")
    again = load_plan("local", copy_file, experiments=["fashion-lenet"])
    assert again.experiment("fashion-lenet")["solver"] == str(solver)
    assert train_command(again, "fashion-lenet", again.point("fashion-lenet", "baseline")) == \
        train_command(original, "fashion-lenet", original.point("fashion-lenet", "baseline"))
    with pytest.raises(FirescaleError, match="no experiments file: workflow/config.yaml is not in"):
        load_plan("local")


def test_a_manifest_of_another_format_is_refused_by_the_plan_and_the_prediction(tmp_path, monkeypatch):
    # One reader for every manifest: the plan (sizes, budgets) and the prediction (the net's input) refuse a
    # manifest.json that is not firescale's, naming the file, instead of reading whatever keys it has.
    from firescale.predict.experiment import predict_experiment

    monkeypatch.chdir(tmp_path)   # the local site's datasets folder is relative: an empty one here
    p = SweepPlan.build({**CONFIG, "site": "local"}, experiments=["fashion-lenet"], base=REPO)
    folder = p.dataset_dir("fashion-lenet")
    folder.mkdir(parents=True)
    manifest = folder / "manifest.json"
    manifest.write_text('{"format": "someone-elses", "version": 1, "splits": {"train": {"records": 5}}}')
    expected = f"{manifest} is not a firescale-dataset manifest of version 1"
    with pytest.raises(FirescaleError, match=expected):
        p.train_images("fashion-lenet")
    with pytest.raises(FirescaleError, match=expected):
        predict_experiment(p, "fashion-lenet")


def _nin_on_ib_cluster(override: dict | None) -> list[str]:
    config = copy.deepcopy(CONFIG)
    config["experiments"]["nin-imagenet"]["sites"]["ib-cluster"] = override
    return [x.name for x in plan("ib-cluster", config).points["nin-imagenet"]]


def test_a_sites_grid_replaces_the_sweeps_explicit_points_unless_it_lists_its_own():
    # workflow/config.yaml: nin-imagenet's sweep lists FireCaffe's three points (g128-b1024 among them), and
    # ib-cluster's override gives its own gpus x batch grid, which is all the site runs.
    assert "g128-b1024-r0" in [x.name for x in plan("titan").points["nin-imagenet"]]    # titan: no override
    shipped = _nin_on_ib_cluster(CONFIG["experiments"]["nin-imagenet"]["sites"]["ib-cluster"])
    assert shipped == ["baseline", "g1-b1024-r0", "g4-b256-r0", "g4-b1024-r0", "g16-b256-r0", "g16-b1024-r0",
                       "g32-b256-r0", "g32-b1024-r0"]
    assert _nin_on_ib_cluster({"gpus": [1, 8]}) == ["baseline", "g8-b256-r0"]          # gpus alone: batch 256
    assert _nin_on_ib_cluster({"batch": [512]}) == ["baseline", "g1-b512-r0"]          # batch alone: 1 GPU
    # its own points: those, not the sweep's
    own = _nin_on_ib_cluster({"gpus": [4], "points": [{"gpus": 8, "batch": 512, "lr": 0.02}]})
    assert own == ["baseline", "g4-b256-r0", "g8-b512-r0"]
    # an override that leaves the grid alone keeps the sweep's points
    assert "g128-b1024-r0" in _nin_on_ib_cluster({"overlap_allreduce": True})
    assert "g128-b1024-r0" in _nin_on_ib_cluster(None)


def test_the_workflows_check_names_the_config_file_that_gives_the_key_and_fills_in_the_defaults(tmp_path):
    """Snakemake merges its config files and --config into one config: the sentence names the file the
    mistake is in (else --config), and the schema's defaults are written into that config, as
    snakemake.utils.validate wrote them, for the rules."""
    from firescale.sweep.config import check_workflow_config

    shipped = REPO / "workflow" / "config.yaml"
    mine = tmp_path / "mine.yaml"
    mine.write_text("experiments:\n  fashion-lenet:\n    sweeps: {gpus: [4]}\n    walltime: 48:00:00\n")
    merged = {**copy.deepcopy(CONFIG), "site": "local"}
    merged["experiments"]["fashion-lenet"]["sweeps"] = {"gpus": [4]}
    with pytest.raises(FirescaleError) as info:
        check_workflow_config(merged, [shipped, mine])
    assert str(info.value).startswith(f"{mine}: unknown key 'sweeps' under 'experiments.fashion-lenet' (did you "
                                      "mean 'sweep'?); allowed keys: batch, calibrate, dataset, "), info.value
    del merged["experiments"]["fashion-lenet"]["sweeps"]
    merged["experiments"]["fashion-lenet"]["walltime"] = 172800
    with pytest.raises(FirescaleError) as info:
        check_workflow_config(merged, [shipped, mine])
    assert str(info.value) == (f"{mine}: key 'experiments.fashion-lenet.walltime' is 172800, which YAML read from "
                               'an unquoted 48:00:00; quote it: walltime: "48:00:00"')
    # the shipped file gives site: local, but not this value: it came from the command line or the profile
    with pytest.raises(FirescaleError) as info:
        check_workflow_config({**copy.deepcopy(CONFIG), "site": "local\n"}, [shipped, mine])
    assert str(info.value).startswith("the workflow's --config (the command line or the profile): key 'site': "
                                      "'local\\n' is not allowed; expected the site to run on"), info.value
    config = {**copy.deepcopy(CONFIG), "site": "local"}
    assert "framework" not in config["experiments"]["fashion-lenet"]
    check_workflow_config(config, [shipped])
    fashion = config["experiments"]["fashion-lenet"]
    assert fashion["framework"] == "tensorflow" and fashion["warmup_iters"] == 0 and fashion["description"]
    assert fashion["dataset"]["test_fraction"] == 0.2 and fashion["dataset"]["transform"]["scale"] == 0.00390625
    assert fashion["target"] == {"tolerance": 0.01} and fashion["max_resubmits"] == 3


@pytest.mark.parametrize("example", sorted((REPO / "workflow" / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_example_merges_into_the_config_and_plans_on_this_machine(example):
    added = yaml.safe_load(example.read_text())["experiments"]
    merged = {**CONFIG, "experiments": {**CONFIG["experiments"], **added}}
    p = SweepPlan.build({**merged, "site": "local"}, experiments=list(added), base=REPO, check_limits=True)
    for name in added:
        assert p.baselines(name) and len(p.points[name]) > len(p.baselines(name))
