"""`firescale vcluster up|down|status`: the virtual multi-node Slurm cluster on this machine (root)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_DIR = Path(".firescale-work") / "vcluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status"),
                        help="up: start (a no-op when already up); down: stop and remove; status: print as JSON")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"folder for its configuration, logs and state (default: {DEFAULT_DIR}, "
                             "as site/vcluster expects)")
    parser.add_argument("--nodes", type=int, default=2, help="compute nodes n1..nN (default 2)")
    parser.add_argument("--name", default="fsvc", help="prefix of its network namespaces (default fsvc)")


def run(args: argparse.Namespace) -> int:
    from firescale.testing.vcluster import VirtualCluster

    cluster = VirtualCluster(root=args.dir.resolve(), nodes=args.nodes, name=args.name)
    if args.action == "up":
        cluster.up()
        print(f"vcluster {cluster.name}: up, nodes {', '.join(cluster.node_names)}; "
              f"Slurm clients: {cluster.bin}/ (e.g. {cluster.bin}/sinfo)")
    elif args.action == "down":
        cluster.down()
        print(f"vcluster {cluster.name}: down")
    else:
        print(json.dumps({"name": cluster.name, "dir": str(cluster.root), "up": cluster.is_up(),
                          "namespaces": cluster.existing_namespaces(), "nodes": cluster.node_states()}, indent=2))
    return 0
