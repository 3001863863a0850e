"""`firescale predict memory NET --batch B` (or `--net NET`): per-layer memory, per-device peaks, splits, a check."""
from __future__ import annotations

import argparse
from pathlib import Path

from firescale.caffe.solver import SOLVER_TYPES
from firescale.commands.args import add_net_argument, chosen_net, input_shape
from firescale.errors import FirescaleError
from firescale.nets.zoo import get_net


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_argument(parser)
    parser.add_argument("--batch", type=int, required=True, help="images per device (per replica when split)")
    parser.add_argument("--input", type=input_shape, help="input H,W,C (default: the net's own)")
    parser.add_argument("--classes", type=int, help="number of classes (default: the net's own)")
    solver = parser.add_mutually_exclusive_group()
    solver.add_argument("--solver", type=Path, help="a solver file: its type, weight decay and dist plan")
    solver.add_argument("--solver-type", choices=SOLVER_TYPES, default="SGD", help="solver type (default SGD)")
    parser.add_argument("--site", help="a site: its device's memory, kind and the copy bandwidth between devices")
    parser.add_argument("--device-kind", choices=("gpu", "cpu"), help="default: the site's, else gpu")
    parser.add_argument("--ranks", type=int, default=1, help="replicas summing gradients (a second gradient copy)")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--devices", type=int, help="plan a split over this many devices of the site's memory")
    split.add_argument("--limits", help="plan a split over devices of these sizes in GB, e.g. 6.35,4.49,8.80")
    split.add_argument("--layer-plan", type=Path, help="check the dist plan in this file (default: --solver's)")
    parser.add_argument("--plan-for", choices=("memory", "time"), default="memory",
                        help="balance a planned split for memory or for compute time (default memory)")
    parser.add_argument("--measure", action="store_true",
                        help="also run one iteration in TensorFlow and show its allocations beside the model")
    parser.add_argument("--plot", help="write the per-layer figure (Oh and Lee's Fig. 2) to PLOT.png and .pdf")
    parser.add_argument("--json", help="also write the per-layer numbers and the peaks here")


def run(args: argparse.Namespace) -> int:
    from firescale.atomic import atomic_write_json
    from firescale.caffe.solver import load_solver
    from firescale.cluster.site import load_site
    from firescale.model.memory import net_memory
    from firescale.model.split import check_plan_memory, plan_peaks
    from firescale.nets.device_plan import arch_devices, read_layer_plan, record_devices

    spec = get_net(chosen_net(args), num_classes=args.classes, input_shape=args.input)
    site = load_site(args.site) if args.site else None
    solver = load_solver(args.solver) if args.solver else None
    kind = args.device_kind or (site.device_kind if site else "gpu")
    memory = net_memory(spec, args.batch, solver.type if solver else args.solver_type,
                        weight_decay=solver.weight_decay > 0 if solver else True, device_kind=kind, ranks=args.ranks)
    limit = site.device_memory if site else None
    _print_layers(memory)
    top = [0] * len(spec.layers)
    if args.layer_plan:
        plan = read_layer_plan(args.layer_plan)
    else:
        plan = solver.dist if solver and not (args.devices or args.limits) else None
    if plan is not None:
        top = arch_devices(plan.train[0], spec, f"{plan.source}: dist (train) arch 0")
        if limit is not None:
            check_plan_memory(memory, spec, top, [limit], f"{plan.source}: dist (train) arch 0")
    elif args.devices or args.limits:
        top = _planned(args, memory, spec, site, limit).devices
    peaks = plan_peaks(memory, spec, top)
    for p in peaks:
        over = f", {(p.bytes - limit) / 1e9:.2f} GB over the {limit / 1e9:g} GB of {site.name}'s device" \
            if site and limit and p.bytes > limit else ""
        print(f"device {p.device}: peak {p.bytes / 1e9:.3f} GB at {p.at} (weights and history "
              f"{p.resident / 1e9:.3f} GB){over}")
    if args.measure:
        _measure(spec, args.batch, solver, args.solver_type, memory)
    if args.plot:
        from firescale.report.memory_plots import write_memory_plot

        plot = Path(args.plot)
        write_memory_plot(memory, plot.parent, f"{spec.name}, batch {args.batch}, {memory.solver_type}",
                          stem=plot.stem, devices=record_devices(spec, top), limit=limit)
    if args.json:
        atomic_write_json(args.json, {"net": spec.name, "batch": args.batch, "solver_type": memory.solver_type,
                                      "device_kind": kind, "layers": [l.__dict__ for l in memory.layers],
                                      "devices": list(top), "peaks": [p.__dict__ for p in peaks]})
    return 0


def _print_layers(memory) -> None:
    print(f"{memory.net}: batch {memory.batch}, {memory.solver_type}, {memory.device_kind} "
          f"(MB; running total includes weights and history)")
    head = f"{'layer':<30} {'forward':>10} {'backward':>10} {'update':>10} {'resident':>10} {'running':>10}"
    print(head)
    print("-" * len(head))
    total = 0
    for l in memory.layers:
        total += l.total
        print(f"{l.name:<30} {l.forward / 1e6:>10.2f} {l.backward / 1e6:>10.2f} {l.update / 1e6:>10.2f} "
              f"{l.resident / 1e6:>10.2f} {total / 1e6:>10.1f}")


def _planned(args: argparse.Namespace, memory, spec, site, limit):
    from firescale.model.layers import net_cost
    from firescale.model.paleo import compute_times, platform_from_site
    from firescale.model.split import per_top_layer, plan_for_memory, plan_for_time

    if args.limits:
        limits = [float(v) * 1e9 for v in args.limits.split(",")]
    elif limit is None:
        raise FirescaleError("--devices needs --site (its device's memory) or give --limits")
    else:
        limits = [limit] * args.devices
    if args.plan_for == "time":
        if site is None:
            raise FirescaleError("--plan-for time needs --site (its device's speed)")
        times = compute_times(net_cost(spec, args.batch), platform_from_site(site).device)
        per_record = [f + b for f, b in zip(times.layer_forward, times.layer_backward)]
        plan = plan_for_time(memory, spec, limits, per_top_layer(spec, per_record))
    else:
        plan = plan_for_memory(memory, spec, limits)
    print(("split that fits: " if plan.fits else "no split over these devices fits; the most even: ")
          + plan.describe())
    print(plan.dist(), end="")
    return plan


def _measure(spec, batch, solver, solver_type, memory) -> None:
    from firescale.bench.memory import comparison_markdown
    from firescale.bench.memory_probe import measure_training_memory
    from firescale.caffe.solver import SolverConfig

    config = solver or SolverConfig(base_lr=0.01, max_iter=1, type=solver_type, weight_decay=0.0005,
                                    momentum={"AdaDelta": 0.95, "AdaGrad": 0.0, "RMSProp": 0.0}.get(solver_type, 0.9))
    print()
    print(comparison_markdown(memory, measure_training_memory(spec, batch, config)), end="")
