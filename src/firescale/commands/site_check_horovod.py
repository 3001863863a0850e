"""`firescale site check-horovod`: does this node's Horovod carry the collective library a site's GPUs need?"""
from __future__ import annotations

import argparse

from firescale.cluster.horovod_build import GPU_OPERATIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", nargs="?", help="site name or path: its devices say what the build needs")
    parser.add_argument("--gpu-operations", choices=(GPU_OPERATIONS,),
                        help="the library GPU tensors need, as a GPU site's job script asks (without a site)")


def run(args: argparse.Namespace) -> int:
    from firescale.cluster.horovod_build import check_build, horovod_built, site_gpu_operations
    from firescale.cluster.site import load_site

    if args.site:
        site = load_site(args.site)
        needs, whose = site_gpu_operations(site), f"site {site.name}"
    else:
        needs, whose = args.gpu_operations, "this job's site"
    print(f"firescale: {check_build(horovod_built(), needs, whose=whose)}")
    return 0
