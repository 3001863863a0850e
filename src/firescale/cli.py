"""The `firescale` command line: a table of commands, each a module imported only when chosen."""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from firescale import __version__
from firescale.errors import FirescaleError

# group -> {subcommand -> (module, one-line help)}; a group whose only key is None takes no subcommand.
# Every module exposes `add_arguments(parser)` and `run(args) -> int`.  Modules are imported lazily
# so that `firescale site lint` does not pay for importing TensorFlow.
COMMANDS: dict[str, dict[str | None, tuple[str, str]]] = {
    "site": {
        "lint": ("firescale.commands.site_lint", "validate a site profile, render and check its job scripts"),
        "render": ("firescale.commands.site_render", "render one job script for a site"),
        "check-horovod": ("firescale.commands.site_check_horovod",
                          "check that this node's Horovod has the collective library a site needs (NCCL on GPUs)"),
    },
    "vcluster": {
        None: ("firescale.commands.vcluster", "a virtual multi-node Slurm cluster in network namespaces (root)"),
    },
    "sweep": {
        "run": ("firescale.commands.sweep_run", "submit a point's job, watch it, resubmit after walltime, collect"),
        "calibrate": ("firescale.commands.sweep_calibrate",
                      "reuse the site's kept calibration of the same key, else run an experiment's calibration "
                      "job on the sweep's nodes, watch it, collect and keep it"),
    },
    "data": {
        "ingest": ("firescale.commands.data_ingest", "write a source as train/test LMDB and HDF5 with a manifest"),
        "verify": ("firescale.commands.data_verify", "re-hash a dataset and decode every record against its manifest"),
    },
    "train": {
        None: ("firescale.commands.train", "train with Horovod: Caffe solvers, eval, snapshots, time-to-accuracy"),
    },
    "bench": {
        "io": ("firescale.commands.bench_io",
               "records/s and MB/s of the LMDB and HDF5 readers, and data wait per step"),
        "allreduce": ("firescale.commands.bench_allreduce",
                      "parameter server vs tree vs ring allreduce, measured beside predicted"),
        "predict": ("firescale.commands.bench_predict",
                    "predicted iteration time beside the real trainer's for 1 and 2 ranks"),
        "trainer": ("firescale.commands.bench_trainer",
                    "images/s of firescale train beside a bare loop of its framework, 1 and 2 ranks"),
        "knobs": ("firescale.commands.bench_knobs",
                  "the trainer's iteration under its allreduce's knobs (Horovod's, PyTorch's bucket), both modes"),
        "layers": ("firescale.commands.bench_layers",
                   "a layer profile of this device: each layer's time inside real iterations (pytorch)"),
        "store": ("firescale.commands.bench_store",
                  "adding 10,000 runs to a results store and comparing two sets of 1,000, beside JSON files"),
        "damage": ("firescale.commands.bench_damage",
                   "damaged copies of a dataset read by the training and test readers: read, stopped, crashed"),
        "gpu": ("firescale.commands.bench_gpu",
                "the GPU check: GPU tests, the default experiment, trainer vs bare loop, step timings (a few min)"),
    },
    "report": {
        None: ("firescale.commands.report", "the reproducibility report: tables, plots, parity, provenance"),
    },
    "results": {
        "add": ("firescale.commands.results_add", "put finished runs into a results store (SQLite or PostgreSQL)"),
        "list": ("firescale.commands.results_list", "the sweeps a results store holds, one line each"),
        "compare": ("firescale.commands.results_compare",
                    "two sets of runs point by point: differences with Welch's 95% intervals, verdicts"),
        "table": ("firescale.commands.results_table", "one paper-style table of an experiment across sites"),
    },
    "predict": {
        "layers": ("firescale.commands.predict_layers", "per-layer FLOPs, |W| and |D| of a net"),
        "sweep": ("firescale.commands.predict_sweep",
                  "predicted iteration time, time-to-accuracy and speedup per sweep point"),
        "paleo": ("firescale.commands.predict_paleo",
                  "Paleo's FireCaffe/NiN case (Table 3) beside FireCaffe's measurements"),
        "trace": ("firescale.commands.predict_trace", "replay a layer-wise trace through the DAG model"),
        "profile": ("firescale.commands.predict_profile",
                    "a layer profile's nets predicted from it, whole and with each net left out"),
        "calibrate": ("firescale.commands.predict_calibrate", "fit percent-of-peak factors from measured runs"),
        "experiment": ("firescale.commands.predict_experiment",
                       "predict every sweep point of an experiment on a site (JSON, Markdown)"),
        "memory": ("firescale.commands.predict_memory",
                   "per-layer memory of a training iteration, per-device peaks, layer splits"),
        "split": ("firescale.commands.predict_split",
                  "a net split over devices: predicted iteration beside a run's measurement"),
    },
}

GROUP_HELP = {
    "site": "site profiles: lint, render job scripts, check Horovod's build",
    "data": "datasets: ingest, verify",
    "train": "train with Horovod (run as N ranks by a launcher)",
    "predict": "performance model: layers, sweep predictions",
    "bench": "benchmarks that print numbers",
    "report": "the reproducibility report",
    "results": "the results store: runs of every sweep, compared across commits, versions and sites",
    "sweep": "sweep points: plan, run and watch jobs",
    "vcluster": "a virtual multi-node Slurm cluster on this machine, for tests and trials",
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="firescale", allow_abbrev=False,
        description="Measure, predict and report how deep-network training scales.",
        epilog="Commands: " + "; ".join(f"{g} ({GROUP_HELP.get(g, '')})" for g in COMMANDS),
    )
    parser.add_argument("--version", action="version", version=f"firescale {__version__}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="command group")
    return parser


def build_parser(group: str) -> argparse.ArgumentParser:
    """The parser of one command group: a group without subcommands with its arguments, else one that names its
    subcommands (`command_parser` parses a subcommand's arguments).

    No parser takes an abbreviated option (allow_abbrev=False, a subcommand's too): a run record keeps its
    command line, and `--frame pytorch` there would be the trainer's --framework to argparse and nothing to
    whoever reads the record."""
    table = COMMANDS[group]
    parser = argparse.ArgumentParser(prog=f"firescale {group}", description=GROUP_HELP.get(group), allow_abbrev=False)
    if list(table) == [None]:
        module, _ = table[None]
        mod = importlib.import_module(module)
        mod.add_arguments(parser)
        parser.set_defaults(_run=mod.run)
        return parser
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for name, (module, help_text) in table.items():
        assert name is not None, f"group {group}: a group with subcommands names each of them"
        sp = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        sp.set_defaults(_module=module)
    return parser


def command_parser(group: str, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand `name` of `group`, its module imported for its arguments."""
    module, help_text = COMMANDS[group][name]
    mod = importlib.import_module(module)
    parser = argparse.ArgumentParser(prog=f"firescale {group} {name}", description=help_text, allow_abbrev=False)
    mod.add_arguments(parser)
    parser.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0].startswith("-"):
        top.parse_args(argv or ["--help"])
        return 0
    group, rest = argv[0], argv[1:]
    if group not in COMMANDS:
        top.error(f"unknown command {group!r}; known: {', '.join(sorted(COMMANDS))}")
    parser = build_parser(group)
    table = COMMANDS[group]
    if list(table) != [None]:
        # Resolve the subcommand first, then import only its module and parse its arguments.
        if not rest or rest[0].startswith("-") or rest[0] not in table:
            parser.parse_args(rest)  # prints usage and exits for a missing or unknown subcommand
            return 2
        parser = command_parser(group, rest[0])
        rest = rest[1:]
    args = parser.parse_args(rest)
    try:
        return int(args._run(args) or 0)
    except FirescaleError as exc:
        print(f"firescale: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("firescale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
