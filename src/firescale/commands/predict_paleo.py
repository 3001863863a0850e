"""`firescale predict paleo`: Paleo's FireCaffe/NiN case (Table 3) reproduced, with FireCaffe's measurements."""
from __future__ import annotations

import argparse

from firescale.atomic import atomic_write_json
from firescale.commands.args import NET_HELP, describe, input_shape, net_name
from firescale.errors import FirescaleError
from firescale.model.paleo import PALEO_TABLE2_NIN_STEP_S, firecaffe_case, firecaffe_platform, paleo_nin
from firescale.nets.spec import Branches, NetSpec
from firescale.nets.zoo import get_net


def add_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_mutually_exclusive_group()
    net.add_argument("--caffe-shapes", action="store_true",
                     help="use NiN with Caffe's ceil-rounded pooling instead of Paleo's floor rounding")
    net.add_argument("--net", type=net_name,
                     help=f"another net on the same platform and rows ({NET_HELP}); Paleo's and FireCaffe's "
                          f"columns are left out, they are NiN's")
    parser.add_argument("--input", type=input_shape, help="with --net: input H,W,C (default: the net's own)")
    parser.add_argument("--classes", type=int, help="with --net: number of classes (default: the net's own)")
    parser.add_argument("--json", help="write the rows to this JSON file")


def run(args: argparse.Namespace) -> int:
    if (args.input or args.classes) and not args.net:
        raise FirescaleError("--input and --classes describe the net of --net; give it too")
    if args.net:
        return _other_net(args, get_net(args.net, num_classes=args.classes, input_shape=args.input))
    spec = get_net("nin") if args.caffe_shapes else paleo_nin()
    rows = firecaffe_case(spec)
    base = rows[0][1].time_to_accuracy_s
    print(describe(firecaffe_platform()))
    print(f"net {spec.name}, 47 epochs of 1,200,000 images, strong scaling, no overlap")
    head = (f"{'gpus':>5} {'batch':>6} {'iter ms':>8} {'ours':>9} {'Paleo':>9} {'ours/Paleo':>10} "
            f"{'FireCaffe':>10} {'ours/FireCaffe':>14} {'speedup':>8} {'Paleo sp.':>9} {'FireCaffe sp.':>13}")
    print(head)
    out = []
    for row, p in rows:
        ours = p.time_to_accuracy_s
        speedup = base / ours
        print(f"{row.gpus:>5} {row.batch:>6} {p.iteration_s * 1e3:>8.1f} {ours / 3600:>8.2f}h "
              f"{row.paleo_s / 3600:>8.2f}h "
              f"{ours / row.paleo_s:>10.3f} {row.firecaffe_s / 3600:>9.2f}h {ours / row.firecaffe_s:>14.3f} "
              f"{speedup:>8.1f} {row.paleo_speedup:>9.1f} {row.firecaffe_speedup:>13.1f}")
        out.append({**p.to_dict(), "paleo_s": row.paleo_s, "firecaffe_s": row.firecaffe_s,
                    "ratio_to_paleo": ours / row.paleo_s, "ratio_to_firecaffe": ours / row.firecaffe_s,
                    "speedup_vs_1gpu_256": speedup})
    step = rows[0][1].iteration_s
    print(f"one step (Paleo's Table 2, 1 GPU, batch 256): ours {step * 1e3:.1f} ms, Paleo "
          f"{PALEO_TABLE2_NIN_STEP_S * 1e3:.0f} ms, ours/Paleo {step / PALEO_TABLE2_NIN_STEP_S:.3f}")
    if args.json:
        atomic_write_json(args.json, {"platform": describe(firecaffe_platform()), "rows": out,
                                      "one_step": {"ours_s": step, "paleo_s": PALEO_TABLE2_NIN_STEP_S}})
    return 0


def _other_net(args: argparse.Namespace, spec: NetSpec) -> int:
    """Paleo's FireCaffe platform and Table 3's GPUs and batches over another net: ours alone."""
    rows = firecaffe_case(spec)
    base = rows[0][1].time_to_accuracy_s
    print(describe(firecaffe_platform()))
    print(f"net {spec.name}" + (f" from {spec.source}" if spec.source else "")
          + ", 47 epochs of 1,200,000 images, strong scaling, no overlap (Paleo's and FireCaffe's times are NiN's)")
    branched = any(isinstance(layer, Branches) for layer in spec.layers)
    if branched:
        print("iter ms runs each block's branches in series (Paleo's upper bound); 'branches concurrent' "
              "runs them at once (its lower bound)")
    print(f"{'gpus':>5} {'batch':>6} {'iter ms':>8}" + (f" {'branches concurrent':>19}" if branched else "")
          + f" {'ours':>9} {'speedup':>8}")
    out = []
    for row, p in rows:
        lower = f" {p.iteration_sequential_lower_s * 1e3:>19.1f}" if branched else ""
        print(f"{row.gpus:>5} {row.batch:>6} {p.iteration_s * 1e3:>8.1f}{lower} {p.time_to_accuracy_s / 3600:>8.2f}h "
              f"{base / p.time_to_accuracy_s:>8.1f}")
        out.append({**p.to_dict(), "speedup_vs_1gpu_256": base / p.time_to_accuracy_s})
    if args.json:
        atomic_write_json(args.json, {"platform": describe(firecaffe_platform()), "net": spec.name,
                                      "net_source": spec.source, "rows": out})
    return 0
