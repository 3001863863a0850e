"""Caffe solver settings read from YAML or a Caffe solver.prototxt, validated key by key."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FirescaleError
from ..layer_plan import PLAN_KEY

SOLVER_TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
# Caffe's history blobs per parameter: one (momentum, or the sum of squares) and a second set for
# AdaDelta (the update history) and Adam (the second moment); the memory model counts them too.
HISTORY_BLOBS = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
# Caffe's old `solver_type` enum spelled the same methods in capitals.
_OLD_SOLVER_TYPES = {t.upper(): t for t in SOLVER_TYPES}
# Keys Caffe solver files often carry that name things outside the solver (the net file, the device).
# They are accepted, kept in `SolverConfig.ignored` and reported, never silently dropped.
RECORDED_ONLY_KEYS = ("net", "train_net", "test_net", "solver_mode", "device_id", "snapshot_format",
                      "snapshot_diff", "debug_info")


@dataclass
class SolverConfig:
    """The solver in Caffe's vocabulary (SolverParameter), with Caffe's defaults."""

    base_lr: float = 0.01
    max_iter: int = 0
    type: str = "SGD"
    lr_policy: str = "fixed"
    gamma: float | None = None
    stepsize: int | None = None
    stepvalue: list[int] = field(default_factory=list)
    power: float | None = None
    momentum: float = 0.0
    momentum2: float = 0.999
    delta: float = 1e-8
    rms_decay: float = 0.99
    weight_decay: float = 0.0
    regularization_type: str = "L2"
    iter_size: int = 1
    clip_gradients: float = -1.0
    test_interval: int = 0
    test_iter: int | None = None
    test_initialization: bool = False
    display: int = 0
    average_loss: int = 1
    snapshot: int = 0
    snapshot_prefix: str = "snapshot"
    snapshot_after_train: bool = True
    random_seed: int = -1
    # Per-layer multipliers (Caffe's ParamSpec lr_mult / decay_mult): layer name -> [weights, bias].
    lr_mult: dict[str, list[float]] = field(default_factory=dict)
    decay_mult: dict[str, list[float]] = field(default_factory=dict)
    ignored: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """All settings as plain JSON-able values (for the result record)."""
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(SolverConfig) if f.name != "ignored"}
_INT_KEYS = {"max_iter", "stepsize", "iter_size", "test_interval", "test_iter", "display", "average_loss",
             "snapshot", "random_seed"}
_FLOAT_KEYS = {"base_lr", "gamma", "power", "momentum", "momentum2", "delta", "rms_decay", "weight_decay",
               "clip_gradients"}
_BOOL_KEYS = {"test_initialization", "snapshot_after_train"}
_STR_KEYS = {"type", "lr_policy", "regularization_type", "snapshot_prefix"}


def _err(source: str, key: str, message: str) -> FirescaleError:
    return FirescaleError(f"{source}: solver key {key!r} {message}")


def _as_int(source: str, key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _err(source, key, f"must be an integer, not {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        value = int(value)
    if not isinstance(value, int):
        raise _err(source, key, f"must be an integer, not {value!r}")
    return value


def _as_float(source: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise _err(source, key, f"must be a number, not {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise _err(source, key, f"must be a number, not {value!r}") from None
    if not math.isfinite(out):
        raise _err(source, key, f"must be a finite number, not {value!r}")
    return out


def _as_bool(source: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _err(source, key, f"must be true or false, not {value!r}")


def _as_mults(source: str, key: str, value: Any) -> dict[str, list[float]]:
    if not isinstance(value, dict):
        raise _err(source, key, "must map layer names to [weights, bias] multipliers")
    out: dict[str, list[float]] = {}
    for layer, mults in value.items():
        if isinstance(mults, (int, float)) and not isinstance(mults, bool):
            mults = [mults, mults]
        if not isinstance(mults, (list, tuple)) or len(mults) != 2:
            raise _err(source, f"{key}.{layer}", f"must be a number or [weights, bias], not {mults!r}")
        pair = [_as_float(source, f"{key}.{layer}", m) for m in mults]
        if min(pair) < 0:
            raise _err(source, f"{key}.{layer}", f"must not be negative, not {mults!r}")
        out[str(layer)] = pair
    return out


def _coerce(source: str, key: str, value: Any) -> Any:
    if key in _INT_KEYS:
        return None if value is None and key in ("stepsize", "test_iter") else _as_int(source, key, value)
    if key in _FLOAT_KEYS:
        return None if value is None and key in ("gamma", "power") else _as_float(source, key, value)
    if key in _BOOL_KEYS:
        return _as_bool(source, key, value)
    if key in _STR_KEYS:
        if not isinstance(value, str):
            raise _err(source, key, f"must be a string, not {value!r}")
        return value
    if key == "stepvalue":
        values = value if isinstance(value, (list, tuple)) else [value]
        return [_as_int(source, key, v) for v in values]
    if key in ("lr_mult", "decay_mult"):
        return _as_mults(source, key, value)
    raise AssertionError(key)


def solver_from_mapping(raw: dict[str, Any], source: str = "solver") -> SolverConfig:
    """Build and validate a SolverConfig from a mapping of Caffe keys; `source` names it in errors."""
    if not isinstance(raw, dict):
        raise FirescaleError(f"{source}: a solver must be a mapping of Caffe solver keys, not {type(raw).__name__}")
    values: dict[str, Any] = {}
    ignored: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key)
        if key == "solver_type":  # old Caffe spelling of `type`
            name = str(value).upper()
            if name not in _OLD_SOLVER_TYPES:
                raise _err(source, key, f"must be one of {', '.join(_OLD_SOLVER_TYPES)}, not {value!r}")
            key, value = "type", _OLD_SOLVER_TYPES[name]
        if key == "test_iter" and isinstance(value, list):  # Caffe repeats it per test net; we have one
            if len(value) != 1:
                raise _err(source, key, f"is given {len(value)} times but there is one test set")
            value = value[0]
        if key == PLAN_KEY:  # the layer-to-device plan, read by firescale.layer_plan
            continue
        if key in RECORDED_ONLY_KEYS:
            ignored[key] = value
            continue
        if key not in _FIELDS:
            known = ", ".join(sorted([*_FIELDS, "solver_type", *RECORDED_ONLY_KEYS]))
            raise FirescaleError(f"{source}: unknown solver key {key!r}; known keys: {known}")
        if key in values:
            raise _err(source, key, "is given twice")
        values[key] = _coerce(source, key, value)
    if "max_iter" not in values:
        raise _err(source, "max_iter", "is required (the number of iterations to train)")
    if "base_lr" not in values:
        raise _err(source, "base_lr", "is required (the base learning rate)")
    config = SolverConfig(**values, ignored=ignored)
    validate(config, source)
    return config


def validate(c: SolverConfig, source: str = "solver") -> None:
    """Check ranges and the keys each solver type and learning-rate policy needs, as Caffe does."""
    def need(cond: bool, key: str, message: str) -> None:
        if not cond:
            raise _err(source, key, message)

    need(c.type in SOLVER_TYPES, "type", f"must be one of {', '.join(SOLVER_TYPES)}, not {c.type!r}")
    need(c.lr_policy in LR_POLICIES, "lr_policy", f"must be one of {', '.join(LR_POLICIES)}, not {c.lr_policy!r}")
    need(c.base_lr > 0, "base_lr", f"must be positive, not {c.base_lr}")
    need(c.max_iter >= 1, "max_iter", f"must be at least 1, not {c.max_iter}")
    need(0 <= c.momentum < 1, "momentum", f"must be in [0, 1), not {c.momentum}")
    need(0 <= c.momentum2 < 1, "momentum2", f"must be in [0, 1), not {c.momentum2}")
    need(c.delta > 0, "delta", f"must be positive, not {c.delta}")
    need(0 <= c.rms_decay <= 1, "rms_decay", f"must be in [0, 1], not {c.rms_decay}")
    need(c.weight_decay >= 0, "weight_decay", f"must not be negative, not {c.weight_decay}")
    need(c.regularization_type in ("L1", "L2"), "regularization_type",
         f"must be L1 or L2, not {c.regularization_type!r}")
    need(c.iter_size >= 1, "iter_size", f"must be at least 1, not {c.iter_size}")
    need(c.test_interval >= 0, "test_interval", f"must not be negative, not {c.test_interval}")
    need(c.test_iter is None or c.test_iter >= 1, "test_iter", f"must be at least 1, not {c.test_iter}")
    need(c.display >= 0, "display", f"must not be negative, not {c.display}")
    need(c.average_loss >= 1, "average_loss", f"must be at least 1, not {c.average_loss}")
    need(c.snapshot >= 0, "snapshot", f"must not be negative, not {c.snapshot}")
    need(bool(c.snapshot_prefix) and "/" not in c.snapshot_prefix, "snapshot_prefix",
         f"must be a plain file-name prefix (snapshots go to RUNDIR/snapshots/), not {c.snapshot_prefix!r}")
    need(c.random_seed >= -1, "random_seed", f"must be -1 (unset) or a non-negative integer, not {c.random_seed}")
    if c.type in ("AdaGrad", "RMSProp"):
        need(c.momentum == 0, "momentum", f"cannot be used with {c.type} (Caffe requires 0), not {c.momentum}")
    if c.type == "AdaDelta":
        need(c.momentum > 0, "momentum", "is AdaDelta's decay rate and must be in (0, 1), e.g. 0.95")
    policy = c.lr_policy
    if policy in ("step", "exp", "inv", "multistep", "sigmoid"):
        need(c.gamma is not None, "gamma", f"is required by lr_policy {policy!r}")
    if policy in ("inv", "poly"):
        need(c.power is not None, "power", f"is required by lr_policy {policy!r}")
    if policy in ("step", "sigmoid"):
        need(c.stepsize is not None, "stepsize", f"is required by lr_policy {policy!r}")
    if policy == "step":
        need(c.stepsize is not None and c.stepsize > 0, "stepsize", f"must be positive, not {c.stepsize}")
    if policy == "multistep":
        need(len(c.stepvalue) > 0, "stepvalue", "is required by lr_policy 'multistep' (one or more iterations)")
        need(all(b > a for a, b in zip(c.stepvalue, c.stepvalue[1:])) and c.stepvalue[0] >= 0, "stepvalue",
             f"must be non-negative and strictly increasing, not {c.stepvalue}")


# ------------------------------------------------------------------ reading files


_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|([{}:])|([^\s{}:#"\']+))')


def parse_prototxt(text: str, source: str) -> dict[str, Any]:
    """Parse Caffe's protobuf text format for a flat SolverParameter; repeated keys become lists."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise FirescaleError(f"{source}: cannot parse solver prototxt near {text[pos:pos + 30]!r}")
        pos = m.end()
        comment, quoted, punct, word = m.groups()
        if comment is not None:
            continue
        if quoted is not None:
            tokens.append(("str", bytes(quoted[1:-1], "utf-8").decode("unicode_escape")))
        elif punct is not None:
            tokens.append(("punct", punct))
        elif word is not None:
            tokens.append(("word", word))
    out: dict[str, Any] = {}
    repeated = {"stepvalue", "test_iter"}
    i = 0
    while i < len(tokens):
        kind, key = tokens[i]
        if kind != "word":
            raise FirescaleError(f"{source}: expected a solver key, found {key!r}")
        if i + 1 < len(tokens) and tokens[i + 1] == ("punct", "{") and key == PLAN_KEY:
            i = _skip_block(tokens, i + 1)  # a layer-to-device plan: firescale.layer_plan reads it
            continue
        if i + 1 < len(tokens) and tokens[i + 1] == ("punct", "{"):
            raise FirescaleError(f"{source}: unknown solver key {key!r} (nested messages such as net_param "
                                 "are not supported; name the net with --net)")
        if i + 2 >= len(tokens) or tokens[i + 1] != ("punct", ":"):
            raise FirescaleError(f"{source}: solver key {key!r} must be followed by ': value'")
        vkind, raw = tokens[i + 2]
        if vkind == "punct":
            raise FirescaleError(f"{source}: solver key {key!r} has no value")
        value: Any = raw if vkind == "str" else _scalar(raw)
        if key in repeated:
            out.setdefault(key, []).append(value)
        elif key in out:
            raise _err(source, key, "is given twice")
        else:
            out[key] = value
        i += 3
    return out


def _skip_block(tokens: list[tuple[str, str]], i: int) -> int:
    """The index after the `}` that closes the `{` at tokens[i]."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += {("punct", "{"): 1, ("punct", "}"): -1}.get(tokens[j], 0)
        if depth == 0:
            return j + 1
    return len(tokens)


def _scalar(word: str) -> Any:
    if re.fullmatch(r"[+-]?\d+", word):
        return int(word)
    try:
        return float(word)
    except ValueError:
        pass
    if word in ("true", "false"):
        return word == "true"
    return word  # an enum such as GPU or SGD


def parse_override(text: str) -> tuple[str, Any]:
    """One `--set key=value` override; the value is read as YAML (numbers, lists, true/false)."""
    import yaml

    if "=" not in text:
        raise FirescaleError(f"--set {text!r}: expected key=value, e.g. base_lr=0.02")
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise FirescaleError(f"--set {text!r}: the value is not valid YAML ({exc.__class__.__name__})") from None
    return key.strip(), value


def load_solver(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SolverConfig:
    """Read a solver from YAML (.yaml/.yml) or Caffe text format (.prototxt), apply `key=value` overrides."""
    from ..yamlfile import parse_yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FirescaleError(f"cannot read solver file {path}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml", ".json"):
        raw = parse_yaml(text, path)  # a key given twice is an error, as in a prototxt
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise FirescaleError(f"{path}: a solver file must be a mapping of Caffe solver keys")
    elif path.suffix in (".prototxt", ".pbtxt", ".txt"):
        raw = parse_prototxt(text, str(path))
    else:
        raise FirescaleError(f"solver file {path}: the name must end in .yaml, .yml or .prototxt")
    for item in overrides:
        key, value = parse_override(item)
        raw[key] = value
    return solver_from_mapping(raw, str(path))
