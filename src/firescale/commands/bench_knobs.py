"""`firescale bench knobs`: the trainer's iteration under settings of its allreduce's knobs, against the site's own."""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from firescale.atomic import atomic_write_json
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from firescale.commands.args import add_training_run_arguments

    add_training_run_arguments(parser, "site whose launcher, environment and horovod: settings start the ranks")
    parser.set_defaults(ranks="2")
    parser.add_argument("--batch-per-rank", default="8,32", help="images per rank per iteration (default 8,32)")
    parser.add_argument("--framework", default=DEFAULT_FRAMEWORK, metavar="NAME",
                        help="the trainer's backend, whose knobs --knob sets: tensorflow (default; Horovod's) or "
                             "pytorch (bucket_mb, the overlapped allreduce's bucket)")
    parser.add_argument("--knob", action="append", default=[], metavar="KEY=V1,V2",
                        help="a Horovod knob of site.yaml's horovod: and the values to try, e.g. cycle_time_ms=0.1,1 "
                             "or fusion_threshold_mb=0,64 ('default': Horovod's own); with --framework pytorch "
                             "bucket_mb=1,25 (FIRESCALE_BUCKET_MB); repeat for a grid")
    parser.add_argument("--mode", choices=("grouped", "overlapped", "both"), default="both",
                        help="the trainer's allreduce: after backward as one group (its default), overlapped with "
                             "backward (--overlap-allreduce), or both (default)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", help="write the settings, every run's iteration and the load averages here")
    parser.epilog = ("The site's own setting, grouped, is the reference: every other setting's median iteration is "
                     "given against it, and 'clear' marks a setting whose every run beat every run of the site's.")


def run(args: argparse.Namespace) -> int:
    from firescale.bench.knobs import KNOBS_FORMAT, Setting, compare_knobs, knob_settings, parse_knob
    from firescale.cluster.site import load_site
    from firescale.commands.args import int_list
    from firescale.data.manifest import load_manifest
    from firescale.frameworks import framework
    from firescale.predict.validation import TrainRuns

    chosen = framework(args.framework)
    ranks, batches = int_list(args.ranks), int_list(args.batch_per_rank)
    if len(ranks) != 1 or ranks[0] < 2:
        raise FirescaleError(f"--ranks {args.ranks}: give one rank count of 2 or more; an allreduce's knobs act "
                             "between ranks")
    if args.iterations < 1:
        raise FirescaleError("--iterations must be at least 1")
    knobs = dict(parse_knob(text, args.framework) for text in args.knob)
    if len(knobs) != len(args.knob):
        raise FirescaleError("--knob: give each key once, with all its values (KEY=V1,V2)")
    site = load_site(args.site)
    overlaps = {"grouped": [False], "overlapped": [True], "both": [False, True]}[args.mode]
    # a framework whose knobs are no site setting yet (PyTorch's bucket) takes its trainer's defaults as the site's
    site_knobs = site.config.get(chosen.site_knobs) if chosen.site_knobs else {}
    settings = knob_settings(site_knobs, knobs, overlaps, args.framework)
    if len(settings) < 2:
        raise FirescaleError("nothing to compare: every setting given is the site's own, grouped; give --knob "
                             "values that differ from the site's, or --mode overlapped or both")
    load_manifest(args.dataset)   # names the file when it is missing or not a firescale manifest

    def go(workdir: Path) -> int:
        def one_run(setting: Setting, batch_per_rank: int, name: str) -> float:
            runs = TrainRuns(args.dataset.resolve(), args.net, args.solver.resolve(), args.iterations, workdir,
                             setting.ranks(site), overlap_allreduce=setting.overlap, framework=args.framework)
            return runs.run(ranks[0], ranks[0] * batch_per_rank, name).iteration_s

        load_before = os.getloadavg()[0]
        rows = compare_knobs(one_run, settings, batches, args.repeats, say=print)
        load_after = os.getloadavg()[0]
        print(f"load average before {load_before:.2f}, after {load_after:.2f} (1 min) on {os.cpu_count()} cores")
        width = max(len(s.label) for s in settings)
        print(f"{'batch/rank':>10}  {'setting':<{width}}  {'iteration ms, each round':<26} {'median ms':>9} "
              f"{'vs site':>8}")
        for batch, batch_rows in rows.items():
            own = batch_rows[0]
            for row in batch_rows:
                each = ", ".join(f"{s * 1e3:.2f}" for s in row.iteration_s)
                versus = "" if row is own else f"{row.change_percent(own):>+7.1f}%"
                print(f"{batch:>10}  {row.setting.label:<{width}}  {each:<26} {row.median_s * 1e3:>9.3f} {versus:>8}"
                      + ("  clear" if row is not own and row.clearly_faster(own) else ""))
        if args.json:
            atomic_write_json(args.json, {
                "format": KNOBS_FORMAT, "site": site.name, "framework": args.framework, "net": args.net,
                "ranks": ranks[0],
                "iterations": args.iterations, "repeats": args.repeats,
                "load_average": [load_before, load_after], "cpus": os.cpu_count(),
                "rows": [r.to_dict(batch_rows[0]) for batch_rows in rows.values() for r in batch_rows]})
        return 0

    if args.workdir:
        return go(args.workdir)
    with tempfile.TemporaryDirectory(prefix="firescale-bench-knobs-") as tmp:
        return go(Path(tmp))
