"""`firescale predict experiment SITE --experiment E`: every sweep point predicted before anything is submitted."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from firescale.atomic import atomic_write_json, atomic_write_text
from firescale.commands.args import format_duration
from firescale.errors import FirescaleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name (site/<name>/site.yaml) or path to a site.yaml")
    parser.add_argument("--experiment", required=True, help="experiment name in the config")
    parser.add_argument("--config", help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--calibration", help="calibration.json of this site from `firescale predict calibrate`")
    parser.add_argument("--dataset-size", type=int,
                        help="training images per epoch when the dataset has no manifest yet")
    parser.add_argument("--ppp-compute", type=float, help="compute percent of peak, 0-1 (instead of a calibration)")
    parser.add_argument("--ppp-comm", type=float, help="communication percent of peak, 0-1 (instead of a calibration)")
    parser.add_argument("--epochs-from", metavar="BASELINE_RECORD",
                        help="model the epochs the baseline needed to reach the sweep's target (its run record)")
    parser.add_argument("--json", help="also write the predictions here (the workflow reads this file)")
    parser.add_argument("--markdown", help="also write them as a Markdown table here")


def run(args: argparse.Namespace) -> int:
    from firescale.commands.args import describe
    from firescale.predict.calibrate import load_calibration
    from firescale.predict.experiment import baseline_epochs_to_target, experiment_platform, predict_experiment
    from firescale.sweep.plan import load_plan

    if args.dataset_size is not None and args.dataset_size < 1:
        raise FirescaleError(f"--dataset-size must be at least 1, not {args.dataset_size}")
    if args.calibration and (args.ppp_compute is not None or args.ppp_comm is not None):
        raise FirescaleError("give either --calibration or --ppp-compute/--ppp-comm, not both")
    plan = load_plan(args.site, args.config)
    calibration = load_calibration(args.calibration) if args.calibration else None
    platform = experiment_platform(plan.site, calibration)
    if args.ppp_compute is not None:
        platform = replace(platform, device=replace(platform.device, ppp=args.ppp_compute))
    if args.ppp_comm is not None:
        platform = replace(platform, link=replace(platform.link, ppp=args.ppp_comm))
    epochs = None
    if args.epochs_from:
        target = plan.config["experiments"][args.experiment]["target"]
        epochs = baseline_epochs_to_target(args.epochs_from, target["tolerance"], target.get("accuracy"))
    result = predict_experiment(plan, args.experiment, calibration=calibration, dataset_size=args.dataset_size,
                                platform=platform, epochs=epochs)
    if args.json:
        atomic_write_json(args.json, result)
    table = markdown_table(result)
    print(describe(platform))
    print(table, end="")   # an uncalibrated one says what x 1 means
    if args.markdown:
        atomic_write_text(Path(args.markdown), table)
    for problem in result["memory_problems"]:
        print(f"error: {problem}")
    return 1 if result["memory_problems"] else 0


def markdown_table(result: dict) -> str:
    """The predictions as a Markdown table with the model's assumptions above it."""
    m = result["model"]
    lines = [f"Predicted: {result['experiment']} on {result['site']} ({m['net']} {tuple(m['input_shape'])}, "
             f"baseline {m['epochs']:.4g} epochs of {m['dataset_size']:,} images, allreduce {result['allreduce']}"
             + (f" over the {result['process_group']} process group (model {m['platform']['algorithm']})"
                if result.get("process_group") else "") + ", "
             + ("calibrated" if result["calibrated"] else "uncalibrated") + _read_note(m["platform"]) + ")", "",
             *([] if result["calibrated"] else [f"**Uncalibrated:** {uncalibrated_note(result)}", ""]),
             "| point | GPUs | batch | LR | epochs | iteration (ms) | comm intra + inter (ms) | I/O + H2D (ms) "
             "| time to accuracy | speedup | memory per device (GB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, p in result["points"].items():
        lines.append(f"| {name} | {p['gpus']} | {p['batch']} | {p['lr']:g} | {p['epochs']:.4g} "
                     f"| {p['iteration_s'] * 1e3:.3f} | {p['comm_intra_s'] * 1e3:.3f} + {p['comm_inter_s'] * 1e3:.3f} "
                     f"| {p['io_s'] * 1e3:.3f} + {p['h2d_s'] * 1e3:.3f} | "
                     f"{format_duration(p['time_to_accuracy_s'])} | {p['speedup']:.2f} | {_memory_cell(p)} |")
    problems = result.get("memory_problems") or []
    return "\n".join(lines + ([""] + [f"- **does not fit:** {text}" for text in problems] if problems else [])) + "\n"


def uncalibrated_note(result: dict) -> str:
    """What an uncalibrated prediction assumed of compute and links (x 1: their peak), and where calibrated
    figures come from."""
    from firescale.model.paleo import PALEO_PPP_COMM, PALEO_PPP_COMPUTE

    ppp = result["percent_of_peak"]
    words = {"peak": {"compute": "compute x 1 is the device's peak", "comm": "links x 1 the link's peak"},
             "given": {"compute": f"compute x {ppp['compute']:.3g} of peak as given (--ppp-compute)",
                       "comm": f"links x {ppp['comm']:.3g} of peak as given (--ppp-comm)"},
             "layer profile": {"compute": f"compute from the site's layer profile (x {ppp['compute']:.3g} of peak "
                                          f"for the layers it lacks)"}}
    note = " and ".join(words[ppp[f"{key}_source"]][key] for key in ("compute", "comm"))
    if "peak" in (ppp["compute_source"], ppp["comm_source"]):
        note += (f"; real runs reach a fraction of peak (Paleo's NiN on Titan's K20X: {PALEO_PPP_COMPUTE:g} of the "
                 f"device's, {PALEO_PPP_COMM:g} of the link's; `firescale predict paleo`)")
    return (note + f". For a calibrated prediction give --calibration "
                   f"results/{result['site']}/{result['experiment']}/calibration.json, which the workflow's "
                   f"calibration job writes once the baseline has run, or a file from `firescale predict calibrate`.")


def _read_note(platform: dict) -> str:
    """The node's read bandwidth behind t_io, and where it came from (site or calibration), if any; and the
    experiment's limit on each rank's reads."""
    source = platform.get("read_bandwidth_source")
    limit = platform.get("rank_read_bandwidth")
    return ((f", read {platform['read_bandwidth'] / 1e9:.4g} GB/s a node from the {source}" if source else "")
            + (f", reads limited to {limit / 1e6:g} MB/s a rank (read_limit_mbs)" if limit else ""))


def _memory_cell(point: dict) -> str:
    memory = point.get("memory")
    if not memory:
        return "—"
    peaks = " + ".join(f"{b / 1e9:.2f}" for b in memory["peak_bytes"]) or "?"
    return f"{peaks} of {memory['limit_bytes'] / 1e9:g}" + ("" if memory["fits"] else " **over**")

