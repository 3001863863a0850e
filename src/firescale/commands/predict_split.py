"""`firescale predict split --record RUN/result.json --site S`: a split run's iteration, predicted beside measured."""
from __future__ import annotations

import argparse
from pathlib import Path

from firescale.commands.args import NET_HELP, input_shape, net_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", required=True, type=Path, help="result.json of a run split over devices")
    parser.add_argument("--site", required=True, help="the site it ran on (its device and copy bandwidth)")
    parser.add_argument("--calibration", help="calibration.json of the site (compute percent of peak, overhead)")
    parser.add_argument("--net", type=net_name, help=f"the net that ran ({NET_HELP}; default: the record's)")
    parser.add_argument("--input", type=input_shape, help="input H,W,C (default: the dataset manifest's)")
    parser.add_argument("--baseline", type=Path, help="result.json of the same run on one device: the measured "
                                                      "cost of the split beside the predicted one")


def run(args: argparse.Namespace) -> int:
    from firescale.cluster.site import load_site
    from firescale.data.manifest import load_manifest
    from firescale.errors import FirescaleError
    from firescale.model.split import split_iteration_time
    from firescale.nets.zoo import get_net
    from firescale.predict.calibrate import load_calibration
    from firescale.predict.experiment import experiment_platform
    from firescale.results import read_result

    result = read_result(args.record)
    if not result.placement:
        raise FirescaleError(f"{args.record}: the run was not split over devices (no 'placement')")
    site = load_site(args.site)
    platform = experiment_platform(site, load_calibration(args.calibration) if args.calibration else None)
    manifest = load_manifest(result.dataset)
    shape = args.input or tuple(int(v) for v in manifest["shape"])
    spec = get_net(args.net or result.net, num_classes=int(manifest["num_classes"]), input_shape=shape)
    names = list(dict.fromkeys(result.placement["devices"]))
    top = [names.index(d) for d in result.placement["devices"]]
    device = site.config["device"]
    bandwidth = float(device.get("copy_bandwidth_gbs", device["memory_bandwidth_gbs"])) * 1e9
    batch = int(result.batch["batch_per_rank"])
    split = split_iteration_time(platform, spec, batch, top, bandwidth)
    whole = split_iteration_time(platform, spec, batch, [0] * len(top), bandwidth)
    measured = {b["after"]: b for b in result.placement["boundaries"]}
    print(f"{spec.name} {shape}, batch {batch} per replica, on {site.name} "
          f"(copies at {bandwidth / 1e9:g} GB/s; compute at {platform.device.ppp:.2f} of peak)")
    for d, seconds in enumerate(split.device_compute_s):
        print(f"  device {d} ({names[d]}): compute {seconds * 1e3:.3f} ms predicted")
    for after, nbytes, seconds in split.copies:
        seen = measured.get(after, {}).get("copy_s")
        print(f"  copy after {after}: {nbytes:,} bytes forward and back, predicted {seconds * 1e3:.3f} ms, "
              + (f"measured {seen * 1e3:.3f} ms" if seen is not None else "not measured"))
    per_iter = result.per_iteration
    step = per_iter.compute_s + per_iter.allreduce_s
    print(f"  iteration: predicted {split.iteration_s * 1e3:.3f} ms split ({whole.iteration_s * 1e3:.3f} ms on one "
          f"device), measured {step * 1e3:.3f} ms (compute and allreduce, data wait "
          f"{per_iter.data_wait_s * 1e3:.3f} ms apart) over {per_iter.iterations} iterations")
    if args.baseline:
        one = read_result(args.baseline).per_iteration
        alone = one.compute_s + one.allreduce_s
        print(f"  the split costs: predicted {(split.iteration_s - whole.iteration_s) * 1e3:+.3f} ms per iteration, "
              f"measured {(step - alone) * 1e3:+.3f} ms ({step * 1e3:.3f} against {alone * 1e3:.3f} ms on one device)")
    return 0
