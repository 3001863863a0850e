"""The GPU check's record as Markdown: a page ready to become docs/benchmarks/<date>-<gpu>-pytorch.md."""
from __future__ import annotations

from typing import Any

GIB = 2.0 ** 30


def _fmt(value: Any, spec: str = "", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _machine(device: dict[str, Any]) -> str:
    if device.get("device", "cpu") == "cpu":
        return f"no GPU: a CPU ({device.get('name') or 'unknown'}), {device.get('cpu_threads')} torch thread(s)"
    return (f"{device.get('name')} (compute capability {device.get('capability')}, "
            f"{_fmt(device.get('memory_bytes') and device['memory_bytes'] / GIB, '.0f')} GiB, "
            f"{device.get('multiprocessors')} multiprocessors), driver {device.get('driver') or 'unknown'}; "
            f"{device.get('cpus')} CPU cores")


def _head(record: dict[str, Any]) -> list[str]:
    device = record.get("device") or {}
    title = str(device.get("name")) if str(device.get("device", "")).startswith("cuda") else "a CPU"
    title += " (smoke run)" if record.get("smoke") else ""
    smoke = " In smoke mode: tiny nets, data and budgets, to test the check itself; not a measurement." \
        if record.get("smoke") else ""
    return [
        f"# The PyTorch backend on {title} ({record.get('date')})", "",
        f"- **Machine:** {_machine(device)}.",
        f"- **Software:** Python {device.get('python')}, PyTorch {device.get('torch')}, "
        f"CUDA {_fmt(device.get('cuda'))}, cuDNN {_fmt(device.get('cudnn'))}, NCCL {_fmt(device.get('nccl'))}, "
        f"NumPy {device.get('numpy')}.",
        f"- **Commit:** {record.get('commit')}.",
        f"- **Command:** `{record.get('command') or 'firescale bench gpu'}`, {record.get('seconds', 0):.0f} s of the "
        f"{record.get('minutes'):g} min it was given.{smoke}",
        "- **What each part does:** [the GPU check](../gpu-check.md).", "",
        "| part | status | seconds | note |", "|---|---|---|---|",
        *[f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | {p['note']} |" for p in record.get("parts", [])],
    ]


def _tests(part: dict[str, Any]) -> list[str]:
    counts = part["data"].get("counts", {})
    said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no count (see pytest.txt)"
    lines = ["", "## The GPU tests", "", f"`pytest -m gpu tests/train/test_torch_gpu.py`: {said}."]
    if part["data"].get("failing"):
        lines.append("Failing: " + ", ".join(f"`{t}`" for t in part["data"]["failing"]) + " (pytest.txt).")
    return lines


def _train(part: dict[str, Any]) -> list[str]:
    data = part["data"]
    if not data:
        return ["", "## The default experiment on the GPU", "", f"Not run: {part['note']}."]
    base = data["baseline"]
    if data["dataset"] == "fashion-mnist":
        what = (f"`{base['experiment']}` ({base['net']}, `{data['solver']}`, batch {base['total_batch']}, one rank) "
                "with `firescale train --framework pytorch`; the target is the TensorFlow baseline's top-1 "
                f"{base['top1']:.3f} less {base['tolerance']} ({base['source']}).")
    else:
        what = (f"Digits stood in for Fashion-MNIST ({base['net']}, `{data['solver']}`, batch {base['total_batch']}, "
                "one rank, `firescale train --framework pytorch`): no target.")
    lines = ["", "## The default experiment on the GPU", "", what, "",
             "| precision | device | top-1 | at iteration | target reached | time to accuracy | train time | "
             "images/s |", "|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(f"| {r['precision']} | {r['device']} | {_fmt(r['top1'], '.4f')} | {r['iter']} | "
                     f"{'yes' if r['reached_target'] else 'no'} | {_fmt(r['time_to_accuracy_s'], '.2f')} s | "
                     f"{r['train_time_s']:.2f} s | {r['images_per_s']:.0f} |")
    return lines


def _bench(part: dict[str, Any]) -> list[str]:
    lines = ["", "## The trainer against a bare loop", ""]
    data = part["data"]
    if not data:
        return [*lines, f"Not run: {part['note']}."]
    lines += [f"`firescale bench trainer --framework pytorch --ranks 1` on {data['dataset']} ({data['net']}, "
              f"{data['iterations']} iterations, rounds: {data['repeats']}; medians):", "",
              "| ranks | batch/rank | trainer images/s | bare images/s | trainer % of bare | (fastest runs) | "
              "last loss trainer / bare |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        trainer, bare = sorted(r["trainer"])[len(r["trainer"]) // 2], sorted(r["bare"])[len(r["bare"]) // 2]
        lines.append(f"| {r['ranks']} | {r['batch_per_rank']} | {trainer:.0f} | {bare:.0f} | {r['percent']:.1f}% | "
                     f"{r['best_percent']:.1f}% | {_fmt(r['trainer_loss'], '.4f')} / {_fmt(r['bare_loss'], '.4f')} |")
    return lines


def _pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    sides = {(r["net"], r["batch"], r["precision"], r["side"]): r for r in rows}
    keys = dict.fromkeys((r["net"], r["batch"], r["precision"]) for r in rows)
    return [(sides[(*k, "trainer")], sides[(*k, "bare")]) for k in keys
            if (*k, "trainer") in sides and (*k, "bare") in sides]


def _step_row(trainer: dict[str, Any], bare: dict[str, Any], net: dict[str, Any]) -> str:
    both = trainer["status"] == bare["status"] == "ok"
    percent = f"{100 * trainer['images_per_s'] / bare['images_per_s']:.1f}%" if both else "–"

    def speed(r: dict[str, Any]) -> str:
        return f"{r['images_per_s']:.0f}" if r["status"] == "ok" else r["status"]

    def peak(r: dict[str, Any], unused: int) -> str:
        return _fmt((r["peak_bytes"] - unused) / GIB if r["peak_bytes"] else None, ".2f")
    copy, history = net.get("initial_bytes", 0), net.get("solver_history_bytes", 0)
    return (f"| {trainer['net']} | {trainer['batch']} | {trainer['precision']} | {speed(trainer)} | {speed(bare)} | "
            f"{percent} | {peak(trainer, copy)} | {peak(bare, copy + history)} | {_fmt(trainer['loss'], '.4f')} / "
            f"{_fmt(bare['loss'], '.4f')} |")


def _steps(part: dict[str, Any]) -> list[str]:
    lines = ["", "## Steps of the ImageNet nets", ""]
    data = part["data"]
    if not data:
        return [*lines, f"Not run: {part['note']}."]
    cudnn = data.get("cudnn", {})
    nets = data.get("nets", {})
    lines += ["`python -m firescale.bench.gpu_steps`: the trainer's `TorchSteps.iteration` (one rank) beside a bare "
              "PyTorch loop of the same net and solver (forward, loss, backward, `torch.optim.SGD`), on random "
              f"batches kept on the device, {data['iterations']} timed iterations after {data['warm_up']} of "
              f"warm-up; cuDNN deterministic {cudnn.get('deterministic')}, benchmark {cudnn.get('benchmark')} "
              "(init_rank's). Peak memory is torch.cuda.max_memory_allocated less the check's own copy of the "
              "starting weights and history (both sides start from it); the bare loop's also less the trainer "
              "solver's history, which it does not use. The two sides' last losses agree up to rounding: the same "
              "update from the same weights, dropout's masks drawn alike.", "",
              "| net | batch | precision | trainer images/s | bare images/s | trainer % of bare | trainer peak GiB | "
              "bare peak GiB | last loss trainer / bare |", "|---|---|---|---|---|---|---|---|---|"]
    for trainer, bare in _pairs(data["rows"]):
        lines.append(_step_row(trainer, bare, nets.get(trainer["net"], {})))
    lines.append("")
    lines.append("Nets: " + "; ".join(f"{n} {v['parameters'] / 1e6:.1f} M parameters, input {v['input']}, built in "
                                      f"{v['seconds']:.1f} s" for n, v in nets.items()) + ".")
    syncs = data.get("syncs") or {}
    if syncs.get("per_iteration"):
        lines.append(f"Host-device synchronisations in one iteration ({syncs['net']}, batch {syncs['batch']}, "
                     f"{syncs['precision']}; torch's sync debug mode): " +
                     ", ".join(f"{k} {v}" for k, v in syncs["per_iteration"].items()) + ".")
    return lines


def render_summary(record: dict[str, Any]) -> str:
    """The Markdown page of a GPU check's record (gpu-check.json)."""
    parts = {p["name"]: p for p in record.get("parts", [])}
    lines = _head(record)
    for name, render in (("tests", _tests), ("train", _train), ("bench", _bench), ("steps", _steps)):
        if name in parts:
            lines += render(parts[name])
    return "\n".join(lines) + "\n"
