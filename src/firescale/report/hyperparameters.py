"""Every hyperparameter a run trained with (FireCaffe 7.1, item 2), read from its training record."""
from __future__ import annotations

from typing import Any

from firescale.nets.zoo import NET_NAMES, get_net
from firescale.sweep.records import RunRecord

DASH = "—"


def _g(value: Any) -> str:
    return DASH if value is None or value == "" else f"{value:g}" if isinstance(value, float) else str(value)


def _policy(s: dict[str, Any]) -> str:
    """The learning-rate policy with the parameters it uses, in Caffe's words."""
    policy = s.get("lr_policy")
    if policy is None:
        return DASH
    params = {"step": [("gamma", "γ"), ("stepsize", "every")], "exp": [("gamma", "γ")],
              "inv": [("gamma", "γ"), ("power", "power")], "multistep": [("gamma", "γ"), ("stepvalue", "at")],
              "poly": [("power", "power")], "sigmoid": [("gamma", "γ"), ("stepsize", "midpoint")]}.get(policy, [])
    parts = [f"{label} {', '.join(map(_g, s[k])) if isinstance(s.get(k), list) else _g(s.get(k))}"
             for k, label in params if s.get(k) is not None]
    return policy + (f" ({'; '.join(parts)})" if parts else "")


def _warmup(s: dict[str, Any], b: dict[str, Any], rate: float | None) -> str:
    iters = b.get("warmup_iters") or 0
    if not iters:
        return "none"
    start = b.get("warmup_start_lr")
    if start is None and rate is not None and b.get("warmup_start_factor") is not None:
        start = rate * b["warmup_start_factor"]
    return f"linear over {iters} iterations" + (f" from {start:g}" if start is not None else "")


def hyperparameters(records: list[RunRecord]) -> dict[str, str]:
    """What the repeats of one point trained with, as the report names it (FireCaffe 7.1, item 2): the
    first's settings (the repeats share them) and every repeat's seed."""
    record = records[0]
    train = record.train
    s, b = (train.solver or {}, train.batch or {}) if train else ({}, {})
    rate = record.lr                 # the sweep sets each point's base_lr to its rate, unscaled
    decay = s.get("weight_decay")
    net = train.net if train else ""
    out = {
        "Batch per GPU": _g(b.get("batch_per_rank") or (record.batch // record.gpus)),
        "iter_size": _g(b.get("iter_size", s.get("iter_size"))),
        "Warm-up": _warmup(s, b, rate),
        "LR policy": _policy(s),
        "max_iter": _g(s.get("max_iter")),
        "Solver": _g(s.get("type")),
        "Momentum": _g(s.get("momentum")) + (f", momentum2 {s['momentum2']:g}" if s.get("type") == "Adam" else ""),
        "Weight decay": DASH if decay is None else f"{decay:g} ({s.get('regularization_type', 'L2')})",
        "Gradient clipping": DASH if s.get("clip_gradients", -1) < 0 else f"L2 norm {s['clip_gradients']:g}",
        "Initialisation": get_net(net).init if net in NET_NAMES else DASH,
        "Seeds": ", ".join(_g(r.train.seed) for r in records if r.train) or DASH,
    }
    ignored = sorted((s.get("ignored") or {}).keys())
    if ignored:
        out["Solver keys ignored"] = ", ".join(ignored)
    return out
