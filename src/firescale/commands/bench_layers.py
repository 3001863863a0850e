"""`firescale bench layers`: each layer's forward and backward time inside real iterations, as a layer profile."""
from __future__ import annotations

import argparse
from pathlib import Path

from firescale.commands.args import int_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nets", required=True,
                        help="comma-separated nets: the GPU check's (alexnet, nin, vgg16, resnet50), lenet, "
                             "cifar10_quick, or any net firescale knows")
    parser.add_argument("--batches", type=int_list, required=True, help="comma-separated batches, e.g. 64,128,256")
    parser.add_argument("--precision", default="fp32", help="fp32 (default), tf32 or bf16")
    parser.add_argument("--iterations", type=int, default=10, help="marked iterations a batch (default 10)")
    parser.add_argument("--warm-up", type=int, default=3, help="unmeasured iterations first (default 3)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the profile (JSON) to write; a site names it under device.precisions.P.profile")
    parser.epilog = "How the model uses a profile: docs/performance-model.md, 'Profiled layers'."


def run(args: argparse.Namespace) -> int:
    from firescale.bench.layers import LayersRequest, profile_layers
    from firescale.model.profile import write_profile

    request = LayersRequest(tuple(n.strip() for n in args.nets.split(",") if n.strip()), tuple(args.batches),
                            args.precision, args.warm_up, args.iterations)
    profile = profile_layers(request, say=lambda s: print(s, flush=True))
    write_profile(args.out, profile)
    print(f"wrote {args.out}: {len(profile.layers)} layers of {', '.join(profile.nets())} on {profile.device} "
          f"in {profile.precision}")
    return 0
