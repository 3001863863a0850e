"""`firescale predict layers NET --batch B` (or `--net NET`): per-layer FLOPs, |W| and |D|, with FireCaffe's Table 1."""
from __future__ import annotations

import argparse

from firescale.atomic import atomic_write_json
from firescale.commands.args import add_net_argument, chosen_net, input_shape, positive_int
from firescale.model.firecaffe_table1 import compare_table1
from firescale.model.layers import NetCost, branch_bounds, net_cost
from firescale.nets.zoo import get_net


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_argument(parser)
    parser.add_argument("--batch", type=positive_int, default=1024, help="images per batch (default 1024, as Table 1)")
    parser.add_argument("--input", type=input_shape, help="input H,W,C (default: the net's own)")
    parser.add_argument("--classes", type=positive_int, help="number of classes (default: the net's own)")
    parser.add_argument("--json", help="also write the table and totals to this JSON file")
    parser.add_argument("--site", help="also each layer's predicted time on this site's device, and where each "
                                       "figure came from (its layer profile, a fit from it, or the peak)")
    parser.add_argument("--precision", default="fp32", help="with --site: the precision trained in (default fp32)")


def run(args: argparse.Namespace) -> int:
    spec = get_net(chosen_net(args), num_classes=args.classes, input_shape=args.input)
    cost = net_cost(spec, args.batch)
    print(f"{spec.name}: input {spec.input_shape} (H, W, C), {spec.num_classes} classes, batch {args.batch}"
          + (f", from {spec.source}" if spec.source else ""))
    for note in spec.notes:
        print(f"note: {note}")
    head = f"{'layer':<34} {'kind':<8} {'output':>15} {'params':>11} {'fwd GFLOP':>11} {'bwd GFLOP':>11} {'|D| MB':>9}"
    print(head)
    print("-" * len(head))
    for l in cost.layers:
        out = "x".join(str(v) for v in l.output_shape)
        print(f"{l.name:<34} {l.kind:<8} {out:>15} {l.params:>11,} {l.forward_flops / 1e9:>11.3f} "
              f"{l.backward_flops / 1e9:>11.3f} {l.activation_bytes / 1e6:>9.1f}")
    print("-" * len(head))
    stored = f" (and {cost.state:,} stored BatchNorm statistics, not learnt)" if cost.state else ""
    print(f"total: {cost.params:,} parameters{stored}, |W| = {cost.weight_bytes / 1e6:.1f} MB, "
          f"|D| = {cost.activation_bytes / 1e6:.0f} MB, forward {cost.forward_flops / 1e12:.3f} TFLOP, "
          f"forward+backward {cost.training_flops / 1e12:.3f} TFLOP per batch")
    forward = branch_bounds(spec, [l.forward_flops for l in cost.layers])
    training = branch_bounds(spec, [l.forward_flops + l.backward_flops for l in cost.layers])
    if forward[0] < forward[1]:
        print(f"with each block's branches at once (Paleo's lower bound), the longest path: forward "
              f"{forward[0] / 1e12:.3f} TFLOP, forward+backward {training[0] / 1e12:.3f} TFLOP; the totals are "
              f"the upper bound, branches in series")
    if args.site:
        _print_times(cost, args.site, args.precision)
    comparison = compare_table1(spec.name, cost) if args.input is None and args.classes is None else None
    if comparison:
        print(f"FireCaffe Table 1 (batch 1024, scaled to {args.batch}): " + "; ".join(
            f"{c.quantity} {c.ours:.4g} vs {c.published:.4g} {c.unit} ({c.difference_percent:+.0f}%)"
            for c in comparison))
    if args.json:
        atomic_write_json(args.json, {
            "net": spec.name, "batch": args.batch, "input_shape": list(spec.input_shape),
            "layers": [{"name": l.name, "kind": l.kind, "output_shape": list(l.output_shape), "params": l.params,
                        "forward_flops": l.forward_flops, "backward_flops": l.backward_flops,
                        "weight_bytes": l.weight_bytes, "activation_bytes": l.activation_bytes}
                       for l in cost.layers],
            "source": spec.source, "notes": list(spec.notes),
            "totals": {"params": cost.params, "stored_statistics": cost.state, "weight_bytes": cost.weight_bytes,
                       "activation_bytes": cost.activation_bytes, "forward_flops": cost.forward_flops,
                       "training_flops": cost.training_flops, "forward_flops_branches_concurrent": forward[0],
                       "training_flops_branches_concurrent": training[0]},
            "firecaffe_table1": [c.__dict__ for c in comparison or []]})
    return 0


def _print_times(cost: NetCost, site_name: str, precision: str) -> None:
    """Paleo's Table 1 per layer: predicted forward and backward ms, the source, and the profile's measurement."""
    from firescale.cluster.site import load_site
    from firescale.frameworks import check_precision
    from firescale.model.paleo import compute_times, platform_from_site

    check_precision(precision)
    platform = platform_from_site(load_site(site_name), precision=precision)
    times = compute_times(cost, platform.device, elementwise=platform.elementwise, profile=platform.profile)
    measured = {lay.signature: lay for lay in platform.profile.layers} if platform.profile else {}
    sources = times.layer_sources or ("peak",) * len(cost.layers)
    profile = platform.profile
    print(f"on {platform.name} in {precision}: " + (f"layer profile {profile.source} ({profile.device})" if profile
                                                     else "no layer profile, every layer at the device's peak "
                                                     f"({platform.device.peak_flops / 1e12:g} TFLOP/s)"))
    head = f"{'layer':<34} {'fwd ms':>9} {'bwd ms':>9} {'source':<22} {'measured fwd':>12} {'bwd':>9}"
    print(head)
    print("-" * len(head))
    for layer, fwd, bwd, source in zip(cost.layers, times.layer_forward, times.layer_backward, sources):
        hit = measured.get(layer.signature)
        seen = f"{1e3 * hit.forward_s:>12.3f} {1e3 * hit.backward_s:>9.3f}" if hit else ""
        print(f"{layer.name:<34} {1e3 * fwd:>9.3f} {1e3 * bwd:>9.3f} {source:<22} {seen}".rstrip())
    print(f"total: forward {1e3 * times.forward:.2f} ms, backward {1e3 * times.backward:.2f} ms, update "
          f"{1e3 * times.update:.2f} ms ({times.update_source})")
