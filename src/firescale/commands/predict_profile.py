"""`firescale predict profile`: a layer profile's nets predicted from it, whole and with each net left out."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", type=Path, nargs="+",
                        help="layer profiles of one device and precision (`firescale bench layers`), taken as one")
    parser.add_argument("--site", required=True,
                        help="the site whose device measured them: its peak in the profile's precision and its "
                             "memory bandwidth are what the fits divide by")


def run(args: argparse.Namespace) -> int:
    from firescale.cluster.site import load_site
    from firescale.model.paleo import Device
    from firescale.model.profile import merge_profiles, read_profile
    from firescale.predict.profile_check import check_profile

    profile = merge_profiles([read_profile(p) for p in args.profiles], ", ".join(map(str, args.profiles)))
    site = load_site(args.site)
    device = Device(profile.device, site.peak_flops_in(profile.precision), site.device_memory_bandwidth)
    print(f"{profile.source}: {', '.join(profile.nets())} on {profile.device} in {profile.precision} "
          f"({profile.framework} {profile.versions.get('torch', '')}, commit {profile.commit or 'unknown'}); "
          f"peak {device.peak_flops / 1e12:g} TFLOP/s, {device.memory_bandwidth / 1e9:g} GB/s ({site.name})")
    head = (f"{'net':<14} {'batch':>6} {'measured ms':>12} {'own ms':>9} {'error':>8} {'left out ms':>12} "
            f"{'error':>8}  left out, layers by source")
    print(head)
    print("-" * len(head))
    for row in check_profile(profile, device):
        sources = ", ".join(f"{k} {v}" for k, v in sorted(row.left_out_sources.items()))
        print(f"{row.net:<14} {row.batch:>6} {1e3 * row.measured_s:>12.2f} {1e3 * row.own_s:>9.2f} "
              f"{row.own_error_pct:>+7.1f}% {1e3 * row.left_out_s:>12.2f} {row.left_out_error_pct:>+7.1f}%  {sources}")
    print("own: every layer measured in the profile (the iteration less what runs between layers); left out: the "
          "net's layers fitted from the other nets' families, else at the device's peak")
    return 0
