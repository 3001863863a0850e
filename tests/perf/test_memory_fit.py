"""Memory before submission: lint and predict flag a point over its device's memory and propose a split;
layer-to-device plans in the solver file (Oh and Lee's dist blocks) are read, checked and refused in one sentence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from vgg19_hand_count import peak_at_backward

from cli import run_firescale
from firescale.caffe.dist import LayerAssign, plan_from_mapping, plan_from_prototxt
from firescale.caffe.solver import load_solver
from firescale.errors import FirescaleError
from firescale.model.memory import net_memory
from firescale.model.split import check_plan_memory, per_top_layer, plan_for_memory, plan_for_time, plan_peaks
from firescale.nets.device_plan import arch_devices, check_devices, read_layer_plan
from firescale.nets.zoo import get_net

REPO = Path(__file__).resolve().parents[2]
NIN_SOLVER = (REPO / "workflow" / "solvers" / "nin-imagenet.prototxt").read_text()

# The seed's Fig. 1 form: a training dist (one arch per replica) then a test dist, fields separated by commas.
VGG_DIST = """
dist {
  arch {
    layer_assign { name: "conv1_1", device: 0 }
    layer_assign { name: "conv3_1", device: 1 }
  }
}
dist {
  arch {
    layer_assign { name: "conv1_1", device: 0 }
  }
}
"""


def _config(tmp_path: Path, solver_text: str, site: str, gpus: list[int], batch: list[int]) -> Path:
    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    solver = tmp_path / "vgg19.prototxt"
    solver.write_text(solver_text)
    config["experiments"] = {"vgg19-imagenet": {
        "description": "VGG-19 at batch 64 per GPU", "net": "vgg19",
        "dataset": {"name": "ilsvrc12", "source": "existing", "transform": {"crop": 224}},
        "solver": str(solver), "batch": {"mode": "per_gpu", "baseline": batch[0]}, "lr_scaling": "linear",
        "epochs": 1, "target": {"tolerance": 0.01}, "walltime": "02:00:00",
        "sweep": {"gpus": gpus, "batch": batch}, "sites": {site: None}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_vgg19_at_batch_64_on_a_k20x_is_flagged_with_a_split_that_fits(tmp_path):
    config = _config(tmp_path, NIN_SOLVER, "titan", [1], [64])
    proc = run_firescale("site", "lint", "titan", "--config", str(config))
    assert proc.returncode == 1, proc.stdout
    line = next(l for l in proc.stdout.splitlines() if "needs" in l and "GB over" in l)
    # the peak counted by hand (vgg19_hand_count), at conv4_4's backward pass at every batch: 8.81 GB at 64, and
    # the largest batch under the K20X's 6 GB is 38
    whole = peak_at_backward(64, "conv4_4")
    fits = max(b for b in range(1, 65) if peak_at_backward(b, "conv4_4") <= 6e9)
    assert (f"point baseline needs {whole / 1e9:.2f} GB on one NVIDIA Tesla K20X (64 images per GPU, SGD), "
            f"{(whole - 6e9) / 1e9:.2f} GB over its 6 GB") in line
    assert "a split over 2 devices fits: conv1_1..pool2 on device 0" in line
    assert 'layer_assign { name: "conv3_1" device: 1 }' in line
    assert "site titan has 1 GPU(s) per node" in line and f"{fits} images per GPU would fit one device" in line

    out = tmp_path / "predict.json"
    proc = run_firescale("predict", "experiment", "titan", "--experiment", "vgg19-imagenet", "--config", str(config),
                      "--json", str(out))
    assert proc.returncode == 1 and f"error: point baseline needs {whole / 1e9:.2f} GB" in proc.stdout
    memory = json.loads(out.read_text())["points"]["baseline"]["memory"]
    assert not memory["fits"] and memory["over_bytes"] == whole - 6e9
    # The proposed split, read back from the solver text it gives, fits two 6 GB K20X.
    plan = plan_from_prototxt(memory["proposed_dist"], "proposal")
    spec = get_net("vgg19")
    devices = arch_devices(plan.train[0], spec, "proposal")
    peaks = check_plan_memory(net_memory(spec, 64, "SGD"), spec, devices, [6e9, 6e9], "the proposal")
    assert len(peaks) == 2 and all(p.bytes <= 6e9 for p in peaks)


def test_a_dist_plan_in_the_solver_file_is_used_and_checked(tmp_path):
    config = _config(tmp_path, NIN_SOLVER + VGG_DIST, "ib-cluster", [1, 4], [160])
    solver = load_solver(tmp_path / "vgg19.prototxt")
    assert solver.base_lr == 0.01 and [a.name for a in solver.dist.train[0]] == ["conv1_1", "conv3_1"]
    assert "dist" not in solver.to_dict()  # the record's solver settings stay the optimisation's
    proc = run_firescale("site", "lint", "ib-cluster", "--config", str(config))
    assert proc.returncode == 0, proc.stdout  # 160 per GPU is over 16 GB on one V100, under it split in two
    config = _config(tmp_path, NIN_SOLVER, "ib-cluster", [1], [160])
    unsplit = run_firescale("site", "lint", "ib-cluster", "--config", str(config))
    assert unsplit.returncode == 1 and "GB over its 16 GB" in unsplit.stdout, unsplit.stdout

    titan = _config(tmp_path, NIN_SOLVER + VGG_DIST, "titan", [1], [64])
    proc = run_firescale("site", "lint", "titan", "--config", str(titan))
    assert proc.returncode == 1
    assert ("dist (train) arch 0: layer_assign 'conv3_1' puts it on device 1, but a node of site titan has "
            "1 device(s), numbered 0 to 0") in proc.stdout


def test_the_seeds_dist_blocks_and_the_yaml_form_read_the_same(tmp_path):
    plan = plan_from_prototxt(NIN_SOLVER + VGG_DIST, "s.prototxt")
    assert plan.replicas == 1 and [a.name for a in plan.train[0]] == ["conv1_1", "conv3_1"] and len(plan.test) == 1
    same = plan_from_mapping({"train": [[{"name": "conv1_1", "device": 0}, {"name": "conv3_1", "device": 1}]],
                              "test": [[{"name": "conv1_1", "device": 0}]]}, "s.yaml")
    assert same.train == plan.train and same.test == plan.test
    solver = tmp_path / "s.yaml"
    solver.write_text("base_lr: 0.01\nmax_iter: 10\ndist:\n  train:\n    - [{name: conv2, device: 1}]\n")
    assert load_solver(solver).max_iter == 10
    assert arch_devices(read_layer_plan(solver).train[0], get_net("lenet_same"), "s") == [0, 0, 1, 1, 1, 1, 1, 1]
    assert load_solver(solver).dist == read_layer_plan(solver)
    assert load_solver(REPO / "workflow" / "solvers" / "lenet-digits.yaml").dist is None


def test_a_solver_file_is_read_once_for_its_settings_and_its_plan(tmp_path, monkeypatch):
    """Fitting the sweep's memory needs the solver's settings and its dist plan: one read of the file."""
    from firescale.cluster.site import load_site
    from firescale.predict.memory_fit import fit_points
    from firescale.sweep.points import SweepPoint

    solver = tmp_path / "vgg19.prototxt"
    solver.write_text(NIN_SOLVER + VGG_DIST)
    reads = []
    for method in ("read_text", "read_bytes"):
        real = getattr(Path, method)
        monkeypatch.setattr(Path, method, lambda self, *a, real=real, **k: reads.append(self) or real(self, *a, **k))
    point = SweepPoint("vgg19", gpus=2, batch=160, lr=0.01, repeat=0, devices=2)
    fits = fit_points(get_net("vgg19"), solver, [point], load_site("ib-cluster"), tmp_path)
    assert reads.count(solver) == 1 and len(fits[0].peaks) == 2 and fits[0].problem is None  # split over the plan's two


@pytest.mark.parametrize("arch, message", [
    ([("conv9", 1)], "layer_assign names layer 'conv9', which net 'lenet_same' does not have (its layers: conv1, "
                     "pool1,"),
    ([("ip1", 1), ("conv2", 0)], "layer_assign 'conv2' comes after 'ip1', which runs later in net 'lenet_same'"),
])
def test_a_plan_naming_an_unknown_layer_or_out_of_order_is_refused(arch, message):
    plan = plan_from_mapping({"train": [[{"name": n, "device": d} for n, d in arch]]}, "p.yaml")
    with pytest.raises(FirescaleError, match="^p.yaml: arch 0: " + message.replace("(", r"\(").replace(")", r"\)")):
        arch_devices(plan.train[0], get_net("lenet_same"), "p.yaml: arch 0")


def test_bad_plans_are_refused_in_one_sentence():
    with pytest.raises(FirescaleError, match="a branch inside inception 'inception_3a'"):
        arch_devices(plan_from_mapping({"train": [[{"name": "inception_3a/3x3", "device": 1}]]}, "g").train[0],
                     get_net("googlenet"), "g")
    with pytest.raises(FirescaleError, match="layer_assign 'ip1' puts it on device 2, but this run has 2 device"):
        check_devices(plan_from_mapping({"train": [[{"name": "ip1", "device": 2}]]}, "p"), 2, "this run")
    with pytest.raises(FirescaleError, match="device '-1'; a device is a number"):
        plan_from_prototxt('dist { arch { layer_assign { name: "ip1" device: -1 } } }', "p")
    with pytest.raises(FirescaleError, match="not closed"):
        plan_from_prototxt('dist { arch { layer_assign { name: "ip1" device: 1 }', "p")
    spec = get_net("vgg19")
    memory = net_memory(spec, 64, "SGD")
    devices = arch_devices(plan_from_prototxt(VGG_DIST, "v").train[0], spec, "v")
    with pytest.raises(FirescaleError) as info:
        check_plan_memory(memory, spec, devices, [4e9, 6e9], "v: dist (train) arch 0")
    text = str(info.value)
    assert text.startswith("v: dist (train) arch 0 leaves device 0 over its memory: ")
    first = peak_at_backward(64, "conv2_2", last="pool2")              # by hand: 5,475,750,400 bytes
    assert f"{first:,} bytes ({first / 1e9:.2f} GB) at layer conv2_2 (backward), where 4.00 GB" in text


def test_planners_balance_memory_on_unequal_devices_and_time_under_limits():
    spec = get_net("vgg19")
    memory = net_memory(spec, 32, "SGD")
    limits = [6.35e9, 4.49e9, 8.80e9]  # the seed's Titan Xp, 980 Ti and Titan X
    plan = plan_for_memory(memory, spec, limits)
    assert plan.fits and len({d for d in plan.devices}) == 3
    shares = [p.bytes / l for p, l in zip(plan.peaks, limits)]
    assert max(shares) - min(shares) < 0.5
    from firescale.model.layers import net_cost
    from firescale.model.paleo import K20X, compute_times

    times = compute_times(net_cost(spec, 32), K20X)
    per_top = per_top_layer(spec, [f + b for f, b in zip(times.layer_forward, times.layer_backward)])
    timed = plan_for_time(memory, spec, [6e9, 6e9], per_top)
    assert timed.fits
    blocks = [sum(t for t, d in zip(per_top, timed.devices) if d == k) for k in (0, 1)]
    assert max(blocks) <= 0.6 * sum(per_top)
    assert max(p.bytes for p in plan_peaks(memory, spec, timed.devices)) <= 6e9


def test_layer_plans_are_read_by_the_strict_readers(tmp_path):
    # A YAML plan goes through the strict YAML reader (a key given twice is refused, naming the line), a
    # prototxt plan through the one reader of Caffe's text format (an unclosed block is named as such).
    plan = tmp_path / "plan.yaml"
    plan.write_text("dist:\n  train: [[{name: conv1, device: 0}]]\n  train: [[{name: conv1, device: 1}]]\n")
    with pytest.raises(FirescaleError, match=r"plan.yaml.*line 3.*'train'"):
        read_layer_plan(plan)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('base_lr: 0.01\ndist { arch { layer_assign { name: "conv1", device: 0 }\n')
    with pytest.raises(FirescaleError, match="solver.prototxt: a block is not closed with '}'"):
        read_layer_plan(solver)
    solver.write_text('base_lr: 0.01\ndist { arch { layer_assign { name: "conv1", device: 0 } } }\n')
    assert read_layer_plan(solver).train == ((LayerAssign("conv1", 0),),)
