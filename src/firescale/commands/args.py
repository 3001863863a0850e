"""Command-line arguments shared by the predict and bench commands: which platform to model."""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from firescale.errors import FirescaleError
from firescale.model.comm import ALGORITHM_NAMES, Link
from firescale.model.paleo import Device, Platform, platform_from_site


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, not {text!r}")
    return values


def positive_int(text: str) -> int:
    """A count that must be 1 or more (a batch, a number of ranks)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}")
    return value


def input_shape(text: str) -> tuple[int, int, int]:
    """A net's input as H,W,C (the argparse type of every --input)."""
    try:
        height, width, channels = (int(x) for x in text.split(","))
    except ValueError:      # not integers, or not three of them
        height = width = channels = 0
    if min(height, width, channels) < 1:
        raise argparse.ArgumentTypeError(f"expected the net's input as H,W,C (three positive integers), not {text!r}")
    return height, width, channels


def net_name(text: str) -> str:
    """A net (the argparse type of every --net): a built-in name as given, or a Caffe net file that exists,
    as its absolute path (so that ranks started elsewhere read the same file)."""
    from pathlib import Path

    from firescale.nets.zoo import NET_NAMES, is_known_net, is_net_file

    if is_known_net(text) and not is_net_file(text):
        return text
    path = Path(text).expanduser()
    if path.is_file():
        return str(path.resolve())
    why = "no such file" if is_net_file(text) or path.suffix else "neither a known net nor a file"
    raise argparse.ArgumentTypeError(f"expected a net: one of {', '.join(NET_NAMES)}, or a Caffe net file "
                                     f"(path/to/train_val.prototxt) that exists, not {text!r} ({why})")


NET_HELP = "a built-in net, or a Caffe net file such as path/to/train_val.prototxt"


def add_net_argument(parser: argparse.ArgumentParser) -> None:
    """The net of a command that names it first: as the positional `net` or as `--net`, as the other commands
    take it (exactly one of the two; `chosen_net` reads it)."""
    from firescale.nets.zoo import NET_NAMES

    either = parser.add_mutually_exclusive_group(required=True)
    either.add_argument("net", nargs="?", type=net_name,
                        help=f"network: {', '.join(NET_NAMES)}, or a Caffe net file (.prototxt)")
    either.add_argument("--net", dest="net_option", metavar="NET", type=net_name, help="the same, as an option")


def chosen_net(args: argparse.Namespace) -> str:
    """The net given to a command of `add_net_argument`."""
    return str(args.net or args.net_option)


def add_training_run_arguments(parser: argparse.ArgumentParser, site_help: str) -> None:
    """What the benchmarks that start `firescale train` on this machine share: dataset, net, solver, site, ranks,
    timed iterations and rounds."""
    from pathlib import Path

    parser.add_argument("--dataset", required=True, type=Path,
                        help="dataset folder with manifest.json, e.g. DATA/digits")
    parser.add_argument("--net", type=net_name, default="lenet_same",
                        help=f"network: {NET_HELP} (default lenet_same, which fits every shipped dataset)")
    parser.add_argument("--solver", type=Path, default=Path("workflow/solvers/lenet-digits.yaml"),
                        help="solver (default workflow/solvers/lenet-digits.yaml)")
    parser.add_argument("--site", default="local", help=site_help)
    parser.add_argument("--ranks", default="1,2", help="rank counts (default 1,2)")
    parser.add_argument("--iterations", type=int, default=400, help="timed iterations per run (default 400)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of runs; medians are compared (default 3)")


def float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, not {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, not {text!r}")
    return values


def add_platform_arguments(parser: argparse.ArgumentParser, *, device: bool = True) -> None:
    g = parser.add_argument_group("platform (a site, or explicit numbers that override it)")
    g.add_argument("--site", help="site name or path to a site.yaml")
    if device:
        g.add_argument("--peak-tflops", type=float, help="device peak, TFLOP/s")
        g.add_argument("--memory-gbs", type=float, help="device memory bandwidth, GB/s")
        g.add_argument("--ppp-compute", type=float, help="compute percent of peak, 0-1 (default 1)")
        g.add_argument("--overhead-ms", type=float,
                       help="fixed time per iteration, ms (an extension beyond Paleo; default 0)")
    g.add_argument("--bandwidth-gbits", type=float, help="link bandwidth, Gbit/s")
    g.add_argument("--latency-us", type=float, help="link latency, microseconds")
    g.add_argument("--ppp-comm", type=float, help="communication percent of peak, 0-1 (default 1)")
    g.add_argument("--algorithm", help="allreduce model: ps (Paleo's OneToAll), firecaffe-ps (FireCaffe's Eq. 3), "
                                       "tree, binary-tree, butterfly, ring, rabenseifner, "
                                       "or a library's own choice: openmpi-default, mpich-default, nccl-default "
                                       "(with --site, 'default' is the site's library's)")


def platform_from_args(args: argparse.Namespace) -> Platform:
    """The site's platform with any explicit numbers applied; explicit numbers alone need no site."""
    site = None
    if args.site:
        from firescale.cluster.site import load_site
        site = load_site(args.site)
        platform = platform_from_site(site)
    else:
        need = ["bandwidth_gbits"] + (["peak_tflops", "memory_gbs"] if hasattr(args, "peak_tflops") else [])
        missing = [n for n in need if getattr(args, n, None) is None]
        if missing:
            raise FirescaleError("give --site or all of " + ", ".join("--" + m.replace("_", "-") for m in missing))
        platform = Platform("command line", Device("device", 1.0, 1.0), Link(1.0), "tree")
    device, link = platform.device, platform.link
    if getattr(args, "peak_tflops", None) is not None:
        device = replace(device, peak_flops=args.peak_tflops * 1e12)
    if getattr(args, "memory_gbs", None) is not None:
        device = replace(device, memory_bandwidth=args.memory_gbs * 1e9)
    if getattr(args, "ppp_compute", None) is not None:
        device = replace(device, ppp=args.ppp_compute)
    if args.bandwidth_gbits is not None:
        link = replace(link, bandwidth=args.bandwidth_gbits * 1e9 / 8)
    if args.latency_us is not None:
        link = replace(link, latency=args.latency_us * 1e-6)
    if args.ppp_comm is not None:
        link = replace(link, ppp=args.ppp_comm)
    platform = replace(platform, device=device, link=link)
    if getattr(args, "overhead_ms", None) is not None:
        platform = replace(platform, overhead_s=args.overhead_ms / 1e3)
    if args.algorithm:
        from firescale.cluster.collectives import site_allreduce
        from firescale.model.comm import canonical_algorithm
        if args.algorithm == "default" and site is not None:
            algorithm = replace(site_allreduce(site), algorithm="default").model
        else:
            algorithm = canonical_algorithm(args.algorithm)
        platform = replace(platform, algorithm=algorithm)
    return platform


def describe(platform: Platform) -> str:
    d, l = platform.device, platform.link
    return (f"{platform.name}: {d.peak_flops / 1e12:.4g} TFLOP/s x {d.ppp:.3g}, {d.memory_bandwidth / 1e9:.4g} GB/s; "
            f"link {l.bandwidth * 8 / 1e9:.4g} Gbit/s x {l.ppp:.3g}, {l.latency * 1e6:.3g} us; "
            + _intra_link(platform)
            + f"allreduce {platform.algorithm}"
            + (f" [{ALGORITHM_NAMES[platform.algorithm]}]" if platform.algorithm in ALGORITHM_NAMES else "")
            + (f"; fixed overhead {platform.overhead_s * 1e3:.4g} ms per iteration" if platform.overhead_s else "")
            + (f"; {platform.comm_hidden_share:.0%} of an allreduce can hide behind backward"
               if 0 < platform.comm_hidden_share < 1 else ""))


def _intra_link(platform: Platform) -> str:
    """The intra-node link as describe() gives it ('' for one link for every hop)."""
    intra = platform.links.intra
    if intra is None:
        return ""
    ppp = platform.link.ppp if platform.links.intra_ppp is None else platform.links.intra_ppp
    return f"in a node {intra.bandwidth * 8 / 1e9:.4g} Gbit/s x {ppp:.3g}, {intra.latency * 1e6:.3g} us; "


def site_or_none(args: Any) -> Any:
    if getattr(args, "site", None):
        from firescale.cluster.site import load_site
        return load_site(args.site)
    return None


def format_duration(seconds: float) -> str:
    """A duration in the largest unit that keeps it readable: d, h, min or s."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.2f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.2f} min"
    return f"{seconds:.2f} s"
