"""Caffe solver settings read from YAML or a Caffe solver.prototxt, validated key by key."""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from firescale.caffe.dist import DevicePlan, plan_from_value
from firescale.caffe.prototxt import PLAN_KEY, parse_prototxt
from firescale.errors import FirescaleError
from firescale.userfile import read_user_text

SOLVER_TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
# Caffe's history blobs per parameter: one (momentum, or the sum of squares) and a second set for
# AdaDelta (the update history) and Adam (the second moment); the memory model counts them too.
HISTORY_BLOBS = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
# Caffe's deprecated `solver_type` enum (SolverParameter.SolverType), by name and by number, as
# Caffe's UpgradeSolverType maps it onto `type`.
OLD_SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                    "ADADELTA": "AdaDelta", "ADAM": "Adam"}
# SolverParameter fields that describe the net, its test nets, the device or Caffe's own output, not
# the optimisation: firescale takes the net from --net, the data from --dataset and the devices from the
# site.  They are accepted, kept in `SolverConfig.ignored` and reported, never silently dropped.
NET_ONLY_KEYS = ("net", "net_param", "train_net", "test_net", "train_net_param", "test_net_param",
                 "train_state", "test_state", "test_compute_loss", "solver_mode", "device_id",
                 "snapshot_diff", "debug_info", "layer_wise_reduce", "weights")
SNAPSHOT_FORMATS = ("BINARYPROTO", "HDF5")  # SolverParameter.SnapshotFormat; BINARYPROTO is Caffe's default
# The test net's file: its data layer's batch_size is what test_iter counts, and its learnable layers must be the
# trained net's (train/net_file.py); one file only: with several test nets the test split is evaluated whole.
TEST_NET_KEY = "test_net"


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
    test_initialization: bool = True
    display: int = 0
    average_loss: int = 1
    snapshot: int = 0
    snapshot_prefix: str = "snapshot"   # as written, or as Caffe completes it (see snapshot_name)
    snapshot_after_train: bool = True
    snapshot_format: str = "BINARYPROTO"   # Caffe's files: .caffemodel/.solverstate, or their .h5 (HDF5)
    random_seed: int = -1
    # Per-layer multipliers (Caffe's ParamSpec lr_mult / decay_mult): layer name -> [weights, bias].
    lr_mult: dict[str, list[float]] = field(default_factory=dict)
    decay_mult: dict[str, list[float]] = field(default_factory=dict)
    ignored: dict[str, Any] = field(default_factory=dict)
    # Oh and Lee's layer-to-device plan (the file's `dist` blocks), read with the rest of the file; None: none.
    dist: DevicePlan | None = None

    def to_dict(self) -> dict[str, Any]:
        """All settings as plain JSON-able values (for the result record); the layer plan is not a
        setting of the optimisation and is recorded where it is used (the run's placement)."""
        settings = dataclasses.asdict(self)
        del settings["dist"]
        return settings

    @property
    def snapshot_name(self) -> str:
        """The file-name prefix of the run's snapshots in RUNDIR/snapshots/: the last component of
        snapshot_prefix (Caffe's `examples/mnist/lenet` writes `lenet_iter_N`)."""
        return PurePosixPath(self.snapshot_prefix).name


_FIELDS = {f.name: f for f in dataclasses.fields(SolverConfig) if f.name != "ignored"}
_INT_KEYS = {"max_iter", "stepsize", "iter_size", "test_interval", "test_iter", "display", "average_loss",
             "snapshot", "random_seed"}
_FLOAT_KEYS = {"base_lr", "gamma", "power", "momentum", "momentum2", "delta", "rms_decay", "weight_decay",
               "clip_gradients"}
_BOOL_KEYS = {"test_initialization", "snapshot_after_train"}
_STR_KEYS = {"type", "lr_policy", "regularization_type", "snapshot_prefix", "snapshot_format"}


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
    if key == "snapshot_format" and isinstance(value, int) and value in (0, 1):
        return ("HDF5", "BINARYPROTO")[value]  # the enum's numbers: HDF5 = 0, BINARYPROTO = 1
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


def _old_solver_type(source: str, raw: dict[str, Any]) -> str:
    """The `type` a deprecated `solver_type: ENUM` names (by name or number), as Caffe upgrades it."""
    if "type" in raw:
        raise _err(source, "solver_type", "and 'type' cannot both be given (Caffe refuses the same); keep 'type'")
    value = raw["solver_type"]
    names = list(OLD_SOLVER_TYPES)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        value = names[value]
    if not isinstance(value, str) or value not in OLD_SOLVER_TYPES:
        raise _err(source, "solver_type", f"must be one of {', '.join(names)} (or 0-{len(names) - 1}), not {value!r}")
    return OLD_SOLVER_TYPES[value]


def _caffe_snapshot_prefix(prefix: Any, source: str) -> str:
    """Caffe's UpgradeSnapshotPrefixProperty: no prefix means the solver file's path without its
    extension; a directory (written with a trailing '/') gets the solver file's name appended."""
    stem = PurePosixPath(Path(source).as_posix()).with_suffix("")
    if prefix is None:
        return str(stem)
    if isinstance(prefix, str) and prefix.endswith("/"):
        return prefix + stem.name
    return prefix


def solver_from_mapping(raw: dict[str, Any], source: str = "solver") -> SolverConfig:
    """Build and validate a SolverConfig from a mapping of Caffe keys, read as Caffe reads a
    SolverParameter; `source` (the solver file) names it in errors and completes snapshot_prefix."""
    if not isinstance(raw, dict):
        raise FirescaleError(f"{source}: a solver must be a mapping of Caffe solver keys, not {type(raw).__name__}")
    raw = {str(k): v for k, v in raw.items()}
    if "solver_type" in raw:
        raw["type"] = _old_solver_type(source, raw)
        del raw["solver_type"]
    values: dict[str, Any] = {}
    ignored: dict[str, Any] = {}
    for key, value in raw.items():
        if key == PLAN_KEY:  # the layer-to-device plan, checked against the net by firescale.nets.device_plan
            values["dist"] = plan_from_value(value, source)
            continue
        if key == "test_iter" and isinstance(value, list):  # repeated: one per test net
            if len(value) == 1:
                value = value[0]
            else:  # several test nets (a test_state each); firescale evaluates its one test split whole
                ignored[key] = value
                continue
        if key == TEST_NET_KEY and isinstance(value, list) and len(value) == 1:
            value = value[0]   # one test net: its file is read (train/net_file.py); several: kept as given
        if key in NET_ONLY_KEYS:
            ignored[key] = value
            continue
        if key not in _FIELDS:
            known = ", ".join(sorted([*_FIELDS, "solver_type", *NET_ONLY_KEYS]))
            raise FirescaleError(f"{source}: unknown solver key {key!r}; known keys: {known}")
        if isinstance(value, dict) and key not in ("lr_mult", "decay_mult"):
            raise _err(source, key, "takes a value, not a message {...}")
        values[key] = _coerce(source, key, value)
    if "max_iter" not in values:
        raise _err(source, "max_iter", "is required (the number of iterations to train)")
    if "base_lr" not in values:
        raise _err(source, "base_lr", "is required (the base learning rate)")
    values["snapshot_prefix"] = _caffe_snapshot_prefix(values.get("snapshot_prefix"), source)
    config = SolverConfig(**values, ignored=ignored)
    validate(config, source)
    return config


# The keys that name the net file; `firescale train` trains it when --net is not given (train/net_file.py).
NET_FILE_KEYS = ("net", "train_net")


def ignored_note(config: SolverConfig) -> str:
    """One sentence naming the solver keys firescale read but does not use, or '' when there are none (the
    net file's `net:`/`train_net:` and one `test_net:` are used by `train` and said apart)."""
    used = (*NET_FILE_KEYS, *([TEST_NET_KEY] if isinstance(config.ignored.get(TEST_NET_KEY), str) else []))
    keys = sorted(k for k in config.ignored if k not in used)
    if not keys:
        return ""
    return ("solver keys ignored (firescale takes the data from --dataset and the devices from the site): "
            f"{', '.join(keys)}")


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
    need(c.snapshot_name not in ("", ".", ".."), "snapshot_prefix",
         f"must end in a file-name prefix (its last component names the files in RUNDIR/snapshots/), "
         f"not {c.snapshot_prefix!r}")
    need(c.snapshot_format in SNAPSHOT_FORMATS, "snapshot_format",
         f"must be {' or '.join(SNAPSHOT_FORMATS)}, not {c.snapshot_format!r}")
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
    problem = _schedule_problem(c)
    if problem:
        raise _err(source, *problem)


# The natural logarithm of the largest float: a rate whose logarithm is above it is not a number.
_MAX_LOG = math.log(sys.float_info.max)


def _schedule_problem(c: SolverConfig) -> tuple[str, str] | None:
    """(key, why) when the policy's rate leaves the positive real numbers over iterations 0..max_iter-1 (a power
    of a negative number, a rate past the largest float), else None: the trainer would meet it mid-run."""
    last, policy, gamma, power = c.max_iter - 1, c.lr_policy, c.gamma, c.power
    log_rate = math.log(c.base_lr)
    if policy in ("step", "exp", "multistep") and gamma is not None:
        steps = {"step": last // (c.stepsize or 1), "exp": last, "multistep": len(c.stepvalue)}[policy]
        if gamma < 0:
            return "gamma", f"must not be negative with lr_policy {policy!r} (the rate would change sign), not {gamma}"
        if gamma > 1 and log_rate + steps * math.log(gamma) > _MAX_LOG:
            return "gamma", (f"is {gamma}, which raised to the power {steps} makes the rate overflow by iteration "
                             f"{last}; expected a rate the run can take")
    if policy == "inv" and gamma is not None and power is not None:
        end = 1.0 + gamma * last
        if not end > 0:
            return "gamma", (f"is {gamma}, which makes 1 + gamma * iter reach {end:g} by iteration {last}, and "
                             f"lr_policy 'inv' raises it to -power; expected it above 0 over the run")
        if not all(math.isfinite(-power * math.log(b)) and log_rate - power * math.log(b) <= _MAX_LOG
                   for b in (1.0, end)):
            return "power", (f"is {power}, which with gamma {gamma} makes the rate overflow within {c.max_iter} "
                             "iterations")
    if policy == "poly" and power is not None and power < 0 and last > 0:
        if log_rate - power * math.log(c.max_iter) > _MAX_LOG:
            return "power", f"is {power}, which makes the rate overflow by iteration {last}"
    return None


# ------------------------------------------------------------------ reading files


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


# The suffixes of a solver file (and of a layer plan's file, read the same way), by format.
YAML_SUFFIXES = (".yaml", ".yml", ".json")
PROTOTXT_SUFFIXES = (".prototxt", ".pbtxt", ".txt")


def read_solver_keys(path: str | Path, what: str = "solver file") -> dict[str, Any]:
    """The keys of a solver file as written, read as its suffix says: YAML (.yaml, .yml, .json; a key given
    twice is an error, as in a prototxt) or Caffe's text format (.prototxt, .pbtxt, .txt).  A layer plan's
    file is read here too, `what` naming it in errors."""
    from firescale.yamlfile import parse_yaml

    path = Path(path)
    if path.suffix not in YAML_SUFFIXES + PROTOTXT_SUFFIXES:
        raise FirescaleError(f"{what} {path}: the name must end in .prototxt (Caffe's text format) or .yaml")
    text = read_user_text(path, what)
    if path.suffix in PROTOTXT_SUFFIXES:
        return parse_prototxt(text, str(path))
    raw = parse_yaml(text, path)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise FirescaleError(f"{path}: a {what} must be a mapping of Caffe solver keys, not {type(raw).__name__}")
    return raw


def load_solver(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SolverConfig:
    """Read a solver from YAML (.yaml/.yml) or Caffe text format (.prototxt), apply `key=value` overrides; its
    layer plan, if the file has `dist` blocks, comes with it (`SolverConfig.dist`)."""
    raw = read_solver_keys(path)
    for item in overrides:
        key, value = parse_override(item)
        if key in ("type", "solver_type"):  # an override of the method replaces either spelling
            raw.pop("type", None)
            raw.pop("solver_type", None)
        raw[key] = value
    return solver_from_mapping(raw, str(path))
