"""`firescale predict sweep`: predicted iteration time, time-to-accuracy and speedup per sweep point."""
from __future__ import annotations

import argparse

from firescale.atomic import atomic_write_json
from firescale.commands.args import (
    add_platform_arguments,
    describe,
    format_duration,
    input_shape,
    int_list,
    net_name,
    platform_from_args,
)
from firescale.model.paleo import IMAGENET_TRAIN_IMAGES, predict_sweep
from firescale.nets.zoo import NET_NAMES
from firescale.predict.calibrate import load_calibration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--net", required=True, type=net_name,
                        help=f"network: {', '.join(NET_NAMES)}, or a Caffe net file (.prototxt)")
    parser.add_argument("--dataset-size", type=int, default=IMAGENET_TRAIN_IMAGES,
                        help=f"training images per epoch (default {IMAGENET_TRAIN_IMAGES:,})")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs to the target accuracy (default 1)")
    parser.add_argument("--gpus", type=int_list, required=True, help="device counts, e.g. 1,2,4")
    parser.add_argument("--batch", type=int_list, required=True,
                        help="batch sizes: global (strong scaling) or per device (weak)")
    parser.add_argument("--scaling", choices=("strong", "weak"), default="strong")
    parser.add_argument("--overlap", action="store_true",
                        help="overlap per-layer gradient communication with the backward pass (DAG model)")
    parser.add_argument("--io-ms", type=float, default=0.0, help="I/O time per iteration, overlapped (ms)")
    parser.add_argument("--input", type=input_shape, help="input H,W,C (default: the net's own)")
    parser.add_argument("--classes", type=int, help="number of classes (default: the net's own)")
    parser.add_argument("--calibration", help="calibration.json from `firescale predict calibrate`")
    parser.add_argument("--json", help="write the predictions to this JSON file")
    add_platform_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from firescale.nets.zoo import get_net

    platform = platform_from_args(args)
    calibration = load_calibration(args.calibration) if args.calibration else None
    spec = get_net(args.net, num_classes=args.classes, input_shape=args.input)
    points = predict_sweep(platform, spec, args.gpus, args.batch, epochs=args.epochs,
                           dataset_size=args.dataset_size, scaling=args.scaling, overlap=args.overlap,
                           io_s=args.io_ms / 1e3, calibration=calibration)
    print(describe(calibration.apply(platform) if calibration else platform))
    print(f"{spec.name}, {args.epochs:g} epochs of {args.dataset_size:,} images, {args.scaling} scaling"
          + (", communication overlapped" if args.overlap else ""))
    head = (f"{'gpus':>5} {'batch':>6} {'per gpu':>7} {'compute ms':>11} {'comm ms':>9} {'iter ms':>9} "
            f"{'iterations':>10} {'time to acc.':>13} {'speedup':>8}")
    print(head)
    for p in points:
        print(f"{p.gpus:>5} {p.batch:>6} {p.batch_per_gpu:>7} {(p.forward_s + p.backward_s + p.update_s) * 1e3:>11.2f} "
              f"{p.comm_s * 1e3:>9.2f} {p.iteration_s * 1e3:>9.2f} {p.iterations:>10,} "
              f"{format_duration(p.time_to_accuracy_s):>13} {p.speedup:>8.2f}")
    if args.json:
        atomic_write_json(args.json, {"platform": describe(platform), "net": spec.name,
                                      "calibration": args.calibration,
                                      "points": [p.to_dict() for p in points]})
    return 0

