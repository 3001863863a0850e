"""`firescale vcluster up|down|status`: the virtual multi-node Slurm cluster on this machine (root)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from firescale.testing.layout import DEFAULT_ROOT as DEFAULT_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status", "link"),
                        help="up: start (a no-op when already up as asked); down: stop and remove; status: print "
                             "as JSON; link: shape every node's link to --gbits")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"folder for its configuration, logs and state (default: {DEFAULT_DIR}, "
                             "as site/vcluster expects)")
    parser.add_argument("--nodes", type=int, default=2, help="compute nodes n1..nN (default 2)")
    parser.add_argument("--cpus-per-node", type=int, default=1,
                        help="with up: CPUs Slurm counts on each node (default 1); each node still owns one real "
                             "core, so K ranks a node take turns on it (2 nodes x 2 ranks: --cpus-per-node 2)")
    parser.add_argument("--name", default="fsvc", help="prefix of its network namespaces (default fsvc)")
    parser.add_argument("--gbits", help="with link: the most each node sends, in Gbit/s (e.g. 1), or 'off' for the "
                                        "bridge's own speed")


def link_gbits(text: str | None) -> float | None:
    """--gbits as a rate, None for 'off'; one sentence when it is neither."""
    from firescale.errors import FirescaleError

    if text is None:
        raise FirescaleError("vcluster link: give --gbits RATE (Gbit/s, e.g. 1) or --gbits off")
    if text.strip().lower() == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise FirescaleError(f"vcluster link: --gbits {text!r} is not a number of Gbit/s or 'off'") from None


def run(args: argparse.Namespace) -> int:
    from firescale.errors import FirescaleError
    from firescale.testing.vcluster import VirtualCluster

    if args.gbits is not None and args.action != "link":
        raise FirescaleError(f"vcluster {args.action}: --gbits goes with `vcluster link` only")
    if args.cpus_per_node != 1 and args.action != "up":
        raise FirescaleError(f"vcluster {args.action}: --cpus-per-node goes with `vcluster up` only")
    cluster = VirtualCluster(root=args.dir.resolve(), nodes=args.nodes, name=args.name,
                             cpus_per_node=args.cpus_per_node)
    if args.action == "link":
        cluster.shape_links(link_gbits(args.gbits))
        rates = cluster.link_rates()
        print(f"vcluster {cluster.name}: links " + ", ".join(f"{n} {r}" for n, r in rates.items()))
    elif args.action == "up":
        cluster.up()
        print(f"vcluster {cluster.name}: up, nodes {', '.join(cluster.node_names)} of {cluster.cpus_per_node} "
              f"CPU{'s' if cluster.cpus_per_node > 1 else ''} on one core each; "
              f"Slurm clients: {cluster.bin}/ (e.g. {cluster.bin}/sinfo)")
    elif args.action == "down":
        cluster.down()
        print(f"vcluster {cluster.name}: down")
    else:
        print(json.dumps({"name": cluster.name, "dir": str(cluster.root), "up": cluster.is_up(),
                          "namespaces": cluster.existing_namespaces(), "nodes": cluster.node_states(),
                          "cpus": cluster.node_cpus(),
                          "links": cluster.link_rates()}, indent=2))
    return 0
