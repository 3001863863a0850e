"""`firescale predict calibrate`: fit the percent-of-peak factors from measurements and store them."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import FirescaleError
from ..netspec import NET_NAMES, get_net
from ..perf.calibrate import CALIBRATION_FILE, calibrate, save_calibration
from ..perf.cli_args import add_platform_arguments, describe, platform_from_args, site_or_none


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--net", required=True, help=f"network of the baseline run: {', '.join(NET_NAMES)}")
    parser.add_argument("--input", help="input H,W,C of the baseline run (default: the net's own)")
    parser.add_argument("--classes", type=int, help="classes of the baseline run (default: the net's own)")
    parser.add_argument("--batch", type=int, required=True, help="batch of the single-device baseline run")
    parser.add_argument("--iteration-s", type=float, required=True,
                        help="measured seconds per iteration of the single-device baseline")
    parser.add_argument("--allreduce-json", help="JSON written by `firescale bench allreduce --json`; "
                                                  "fits the communication factor from its largest tree run")
    parser.add_argument("--out", help=f"where to write it (default: the site's results dir/{CALIBRATION_FILE})")
    add_platform_arguments(parser)


def _allreduce_measurement(path: str, algorithm: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FirescaleError(f"cannot read allreduce measurements {path}: {exc}") from None
    runs = [r for r in data.get("measurements", []) if r.get("algorithm") == algorithm and r.get("ranks", 1) > 1]
    if not runs:
        raise FirescaleError(f"{path}: no '{algorithm}' measurement over 2 or more ranks")
    best = max(runs, key=lambda r: (r["ranks"], r["bytes"]))
    return {"algorithm": algorithm, "bytes": best["bytes"], "ranks": best["ranks"], "seconds": best["median_s"]}


def run(args: argparse.Namespace) -> int:
    platform = platform_from_args(args)
    shape = tuple(int(x) for x in args.input.split(",")) if args.input else None
    spec = get_net(args.net, num_classes=args.classes, input_shape=shape)
    measurement = _allreduce_measurement(args.allreduce_json, platform.algorithm) if args.allreduce_json else None
    cal = calibrate(platform, spec, args.batch, args.iteration_s, measurement)
    if args.out:
        out = Path(args.out)
    else:
        site = site_or_none(args)
        if site is None:
            raise FirescaleError("give --out, or --site so that the calibration goes to the site's results")
        out = site.paths.results / CALIBRATION_FILE
    save_calibration(out, cal)
    print(describe(cal.apply(platform)))
    print(f"compute percent of peak {cal.ppp_compute:.4f}, communication {cal.ppp_comm:.4f} -> {out}")
    return 0
