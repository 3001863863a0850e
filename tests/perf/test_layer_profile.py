"""Layer profiles (Paleo's profiled layers): measured inside real iterations, read back, and used by the model
layer by layer: measured where the profile has the layer's shape, fitted per family, else at the peak."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cli import run_firescale
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.model.layers import net_cost
from firescale.model.paleo import Device, compute_times, platform_from_site
from firescale.model.profile import (
    LayerProfile,
    ProfiledIteration,
    ProfiledLayer,
    fit_efficiencies,
    profile_from_dict,
    read_profile,
    write_profile,
)
from firescale.model.traces import LayerTrace
from firescale.nets.zoo import get_net
from firescale.predict.profile_check import check_profile

REPO = Path(__file__).resolve().parents[2]
PEAK, BANDWIDTH = 1e12, 100e9
DEVICE = Device("test device", PEAK, BANDWIDTH, ppp=0.5)


def _ideal(flops: float, memory_bytes: float) -> float:
    return flops / PEAK + memory_bytes / BANDWIDTH


def _timed(forward_s: float, backward_s: float) -> LayerTrace:
    """A trace row of these times, as a backend's profile_layers gives one."""
    return LayerTrace(1, "layer", forward_s * 1e6, backward_s * 1e6, 0.0, 0)


def _profile_of(net: str, batch: int, efficiency: dict[str, float], precision: str = "fp32") -> LayerProfile:
    """`net`'s layers as if each family ran at `efficiency` of the roofline (1.0 where not given)."""
    cost = net_cost(get_net(net), batch)
    layers = tuple(ProfiledLayer.of(net, layer, _timed(_ideal(layer.forward_flops, layer.forward_memory_bytes)
                                                       / efficiency.get(layer.family, 1.0),
                                                       _ideal(layer.backward_flops, layer.backward_memory_bytes)
                                                       / efficiency.get(layer.family, 1.0))) for layer in cost.layers)
    layers_s = sum(lay.forward_s + lay.backward_s for lay in layers)
    update_s = _ideal(2.0 * cost.params, 3.0 * cost.weight_bytes)   # the update at the roofline
    return LayerProfile("test device", precision, "pytorch", layers,
                        (ProfiledIteration(net, batch, layers_s + update_s, layers_s, update_s, cost.params),))


def test_a_layer_in_the_profile_takes_its_measured_time_else_its_familys_fit_else_the_peak():
    cost = net_cost(get_net("lenet_same"), 32)
    conv1, conv2, pool1 = cost.layers[0], cost.layers[2], cost.layers[1]
    assert (conv1.family, conv2.family, pool1.family) == ("conv5x5s1", "conv5x5s1", "pool")
    # The profile measured conv2 alone, at a fifth of the roofline forward and a tenth backward.
    measured = ProfiledLayer.of("lenet_same", conv2, _timed(5 * _ideal(conv2.forward_flops, conv2.forward_memory_bytes),
                                                            10 * _ideal(conv2.backward_flops,
                                                                        conv2.backward_memory_bytes)))
    profile = LayerProfile("test device", "fp32", "pytorch", (measured,))
    times = compute_times(cost, DEVICE, profile=profile)
    sources = dict(zip((lay.name for lay in cost.layers), times.layer_sources))
    assert sources["conv2"] == "measured" and sources["conv1"] == "fitted conv5x5s1" and sources["pool1"] == "peak"
    assert times.layer_forward[2] == measured.forward_s and times.layer_backward[2] == measured.backward_s
    # conv1 shares conv2's family: the same fractions of its own roofline
    assert times.layer_forward[0] == pytest.approx(5 * _ideal(conv1.forward_flops, conv1.forward_memory_bytes))
    assert times.layer_backward[0] == pytest.approx(10 * _ideal(conv1.backward_flops, conv1.backward_memory_bytes))
    # a layer no family of the profile covers: its FLOPs and bytes at the device's percent of peak, as without one
    plain = compute_times(cost, DEVICE)
    assert times.layer_forward[1] == plain.layer_forward[1] and times.update_source == "peak"
    assert plain.layer_sources == () and plain.update_source == "peak"


def test_a_family_unseen_falls_back_to_its_kind():
    vgg = net_cost(get_net("vgg16"), 4)     # 3x3 convolutions only
    profile = LayerProfile("test device", "fp32", "pytorch",
                           tuple(ProfiledLayer.of("vgg16", lay, _timed(2 * _ideal(lay.forward_flops,
                                                                                  lay.forward_memory_bytes),
                                                                       2 * _ideal(lay.backward_flops,
                                                                                  lay.backward_memory_bytes)))
                                 for lay in vgg.layers if lay.kind == "conv"))
    alexnet = net_cost(get_net("alexnet"), 4)   # 11x11, 5x5 and 3x3 convolutions
    times = compute_times(alexnet, DEVICE, profile=profile)
    by_family = {lay.family: src for lay, src in zip(alexnet.layers, times.layer_sources) if lay.kind == "conv"}
    assert by_family["conv3x3s1"] == "fitted conv3x3s1" and by_family["conv11x11s4"] == "fitted conv"
    fits = fit_efficiencies(profile, PEAK, BANDWIDTH)
    assert fits.family["conv3x3s1"] == pytest.approx((0.5, 0.5)) and fits.kind["conv"] == pytest.approx((0.5, 0.5))


def test_leaving_a_net_out_predicts_it_from_the_others_families():
    # Two nets whose convolutions and fully connected layers ran at known fractions of the roofline: with AlexNet
    # left out, its layers of the families VGG-16 has are fitted from VGG-16's, exactly; the rest at the peak.
    efficiency = {"conv3x3s1": 0.25, "fc": 0.5, "pool": 0.1, "relu": 0.05, "dropout": 0.05, "softmax": 0.05}
    profile = _profile_of("vgg16", 8, efficiency)
    alexnet = _profile_of("alexnet", 8, efficiency)
    both = replace(profile, layers=profile.layers + alexnet.layers, iterations=profile.iterations + alexnet.iterations)
    rows = {row.net: row for row in check_profile(both, replace(DEVICE, ppp=1.0))}
    assert rows["vgg16"].own_s == pytest.approx(rows["vgg16"].measured_s)   # its own layers, all measured
    assert rows["alexnet"].own_s == pytest.approx(rows["alexnet"].measured_s)
    left = rows["alexnet"]
    assert left.left_out_sources["fitted"] > 0 and left.left_out_sources.get("peak", 0) > 0
    # the families VGG-16 lacks (11x11 and 5x5 convolutions, LRN) fall to the kind fit or the peak: AlexNet's
    # layers of those families ran at 1.0 here, and the kind's fit (0.25) predicts them 4x long
    assert left.left_out_s > left.measured_s


def test_a_profile_is_written_and_read_back_and_bad_ones_are_one_sentence(tmp_path):
    profile = _profile_of("lenet_same", 16, {"fc": 0.5})
    path = write_profile(tmp_path / "p.json", profile)
    back = read_profile(path)
    assert replace(back, source="") == replace(profile, source="") and back.source == str(path)
    with pytest.raises(FirescaleError, match=r"x.json is not a layer profile: expected an object with \"format\""):
        profile_from_dict({"layers": []}, "x.json")
    data = json.loads(path.read_text())
    data["layers"][2]["forward_s"] = -1
    with pytest.raises(FirescaleError, match=r"x.json: layers\[2\]: key 'forward_s' must be a number >= 0, not -1"):
        profile_from_dict(data, "x.json")
    data = json.loads(path.read_text())
    data["layers"][0]["input_shape"] = [28, 28]
    with pytest.raises(FirescaleError, match=r"layers\[0\].input_shape must be a shape \[H, W, C\]"):
        profile_from_dict(data, "x.json")


def _site_with(tmp_path: Path, precisions: dict) -> Path:
    config = yaml.safe_load((REPO / "site" / "local" / "site.yaml").read_text())
    config["device"]["precisions"] = precisions
    folder = tmp_path / "local"
    folder.mkdir(exist_ok=True)
    (folder / "site.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def test_a_site_gives_its_peak_and_profile_per_precision(tmp_path):
    folder = _site_with(tmp_path, {"bf16": {"peak_tflops": 2.5, "profile": "bf16.json"}})
    write_profile(folder / "bf16.json", _profile_of("lenet_same", 16, {}, precision="bf16"))
    site = load_site(folder)
    fp32, bf16 = platform_from_site(site), platform_from_site(site, precision="bf16")
    assert fp32.device.peak_flops == site.device_peak_flops and fp32.profile is None
    assert bf16.device.peak_flops == 2.5e12 and bf16.profile is not None and bf16.profile.precision == "bf16"
    assert platform_from_site(site, precision="tf32").device.peak_flops == site.device_peak_flops
    write_profile(folder / "bf16.json", _profile_of("lenet_same", 16, {}, precision="fp32"))
    with pytest.raises(FirescaleError, match=r"device.precisions.bf16.profile names .*bf16.json, a profile "
                                             r"measured in fp32, not bf16"):
        platform_from_site(site, precision="bf16")
    bad = _site_with(tmp_path, {"fp8": {"peak_tflops": 9.0}})
    proc = run_firescale("site", "lint", bad)
    assert proc.returncode == 1 and "precisions" in proc.stdout and "fp8" in proc.stdout, proc.stdout


def test_predict_layers_shows_each_layers_source_and_the_profiles_measurement(tmp_path):
    folder = _site_with(tmp_path, {"fp32": {"profile": "fp32.json"}})
    write_profile(folder / "fp32.json", _profile_of("lenet_same", 16, {"conv5x5s1": 0.5}))
    proc = run_firescale("predict", "layers", "lenet_same", "--batch", "32", "--site", folder)
    assert proc.returncode == 0, proc.stderr
    assert f"layer profile {folder / 'fp32.json'}" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("conv2 ") and "fitted" in ln)
    assert "fitted conv5x5s1" in line
    proc = run_firescale("predict", "layers", "lenet_same", "--batch", "16", "--site", folder)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("conv2 ") and "measured" in ln)
    fwd, bwd, source, seen_fwd, seen_bwd = line.split()[1:]
    assert source == "measured" and (fwd, bwd) == (seen_fwd, seen_bwd)


@pytest.mark.pytorch
def test_bench_layers_times_every_layer_inside_real_iterations_on_this_cpu(tmp_path):
    out = tmp_path / "lenet.json"
    proc = run_firescale("bench", "layers", "--nets", "lenet", "--batches", "8,16", "--iterations", "2",
                         "--warm-up", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    profile = read_profile(out)
    assert profile.precision == "fp32" and profile.framework == "pytorch" and profile.versions["torch"]
    for batch in (8, 16):
        names = [lay.name for lay in profile.layers if lay.batch == batch]
        assert names == [lay.name for lay in net_cost(get_net("lenet_same"), batch).layers]
    assert all(lay.forward_s > 0 for lay in profile.layers)
    assert all(lay.backward_s > 0 for lay in profile.layers if lay.backward_flops > 0)
    assert [(it.net, it.batch) for it in profile.iterations] == [("lenet_same", 8), ("lenet_same", 16)]
    assert all(it.iteration_s > 0 and it.update_s > 0 and it.params == 1_256_080 for it in profile.iterations)


@pytest.mark.pytorch
def test_the_marks_change_no_gradient():
    import torch

    from firescale.train.torch.nets import build_net
    from firescale.train.torch.profile import IterationProbe
    from firescale.train.torch.steps import loss_and_gradients

    spec = get_net("cifar10_quick")
    net = build_net(spec, seed=3)
    rng = torch.Generator().manual_seed(0)
    images = torch.randn((4, spec.input_shape[2], *spec.input_shape[:2]), generator=rng)
    labels = torch.randint(0, spec.num_classes, (4,), generator=rng)
    _, plain = loss_and_gradients(net, images, labels)
    marked = IterationProbe(net).run(images, labels)
    assert len(marked) == len(plain)
    for a, b in zip(plain, marked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not hasattr(net, "_layer") or net._layer.__func__ is type(net)._layer  # the probe uninstalled itself
