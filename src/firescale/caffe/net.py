"""Caffe's net files (NetParameter in text form, `layer` and old V1 `layers`): typed layers of one phase."""
from __future__ import annotations

from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, cast

from firescale.caffe.prototxt import parse_prototxt
from firescale.errors import FirescaleError
from firescale.userfile import read_user_text

Phase = Literal["TRAIN", "TEST"]
PHASES: tuple[str, ...] = ("TRAIN", "TEST")

# V1LayerParameter's type enum (the `layers { type: CONVOLUTION }` of files before 2015) as today's names.
V1_TYPES = {
    "CONVOLUTION": "Convolution", "POOLING": "Pooling", "INNER_PRODUCT": "InnerProduct", "RELU": "ReLU",
    "SIGMOID": "Sigmoid", "TANH": "TanH", "LRN": "LRN", "DROPOUT": "Dropout", "CONCAT": "Concat",
    "ELTWISE": "Eltwise", "FLATTEN": "Flatten", "SPLIT": "Split", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "ACCURACY": "Accuracy", "DATA": "Data", "IMAGE_DATA": "ImageData",
    "HDF5_DATA": "HDF5Data",
}
DATA_TYPES = ("Data", "ImageData", "HDF5Data", "Input")
LAYER_TYPES: tuple[str, ...] = (*DATA_TYPES, "Convolution", "Pooling", "InnerProduct", "ReLU", "Sigmoid", "TanH",
                                "LRN", "Dropout", "Concat", "Eltwise", "BatchNorm", "Scale", "Flatten", "Split",
                                "Softmax", "SoftmaxWithLoss", "Accuracy")
# NetParameter fields that say nothing about the net's layers or shapes.
_IGNORED_NET_KEYS = frozenset({"force_backward", "state", "debug_info"})


@dataclass(frozen=True)
class Filler:
    """Caffe's FillerParameter, with Caffe's defaults (a missing filler is constant 0)."""

    type: str = "constant"
    value: float = 0.0
    std: float = 1.0
    mean: float = 0.0
    min: float = 0.0
    max: float = 1.0
    variance_norm: str = "FAN_IN"


@dataclass(frozen=True)
class ParamSpec:
    """One `param { lr_mult decay_mult }` (V1: one `blobs_lr` and one `weight_decay`) of a learnable blob."""

    lr_mult: float = 1.0
    decay_mult: float = 1.0


@dataclass(frozen=True)
class Convolution:
    """ConvolutionParameter; kernel, stride, pad and dilation as (height, width)."""

    num_output: int
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    group: int = 1
    bias_term: bool = True
    weight_filler: Filler = Filler()
    bias_filler: Filler = Filler()


@dataclass(frozen=True)
class Pooling:
    """PoolingParameter; kernel, stride and pad as (height, width); Caffe rounds up unless `round_mode` FLOOR."""

    pool: str = "MAX"
    kernel: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    global_pooling: bool = False
    round_mode: str = "CEIL"


@dataclass(frozen=True)
class InnerProductParam:
    num_output: int
    bias_term: bool = True
    weight_filler: Filler = Filler()
    bias_filler: Filler = Filler()
    axis: int = 1


@dataclass(frozen=True)
class LRNParam:
    local_size: int = 5
    alpha: float = 1.0
    beta: float = 0.75
    k: float = 1.0
    norm_region: str = "ACROSS_CHANNELS"


@dataclass(frozen=True)
class DropoutParam:
    ratio: float = 0.5


@dataclass(frozen=True)
class ConcatParam:
    axis: int = 1


@dataclass(frozen=True)
class EltwiseParam:
    operation: str = "SUM"
    coeff: tuple[float, ...] = ()


@dataclass(frozen=True)
class BatchNormParam:
    use_global_stats: bool | None = None
    eps: float = 1e-5
    moving_average_fraction: float = 0.999


@dataclass(frozen=True)
class ScaleParam:
    bias_term: bool = False
    axis: int = 1
    num_axes: int = 1


@dataclass(frozen=True)
class SimpleParam:
    """The one setting of ReLU (negative_slope), Softmax/Flatten (axis) or Accuracy (top_k) that matters here."""

    negative_slope: float = 0.0
    axis: int = 1
    top_k: int = 1


@dataclass(frozen=True)
class DataParam:
    """Where a data layer reads (`source`), its batch, the image shape (H, W, C) when the file says it, and its
    transform_param with Caffe's defaults (scale 1, no mean, no crop, no mirror)."""

    source: str = ""
    batch_size: int = 0
    shape: tuple[int, int, int] | None = None
    crop_size: int = 0
    scale: float = 1.0
    mean_value: tuple[float, ...] = ()
    mean_file: str = ""
    mirror: bool = False


Settings = (Convolution | Pooling | InnerProductParam | LRNParam | DropoutParam | ConcatParam | EltwiseParam
            | BatchNormParam | ScaleParam | SimpleParam | DataParam)


@dataclass(frozen=True)
class CaffeLayer:
    """One layer of the chosen phase: its type as today's Caffe names it, its blobs, params and settings."""

    name: str
    type: str
    bottom: tuple[str, ...]
    top: tuple[str, ...]
    params: tuple[ParamSpec, ...] = ()
    settings: Settings | None = None
    loss_weight: tuple[float, ...] = ()

    @property
    def in_place(self) -> bool:
        return len(self.bottom) == 1 and self.bottom == self.top


@dataclass(frozen=True)
class CaffeNetFile:
    """A net file read for one phase: layers in file order, and the top-level inputs as (blob, N, C, H, W)."""

    name: str
    source: str
    phase: Phase
    layers: tuple[CaffeLayer, ...]
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    v1: bool = False

    def layer(self, name: str) -> CaffeLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)


# ---------------------------------------------------------------- small readers of a message


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _one(message: dict[str, Any], key: str, default: Any, where: str) -> Any:
    value = message.get(key, default)
    if isinstance(value, list):
        raise FirescaleError(f"{where}: {key!r} is given {len(value)} times; Caffe takes it once")
    return value


def _number(message: dict[str, Any], key: str, default: float, where: str) -> float:
    value = _one(message, key, default, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FirescaleError(f"{where}: {key!r} is {value!r}; expected a number")
    return float(value)


def _int(message: dict[str, Any], key: str, default: int, where: str) -> int:
    value = _one(message, key, default, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FirescaleError(f"{where}: {key!r} is {value!r}; expected a whole number")
    return value


def _bool(message: dict[str, Any], key: str, default: bool | None, where: str) -> bool | None:
    value = _one(message, key, default, where)
    if value is not None and not isinstance(value, bool):
        raise FirescaleError(f"{where}: {key!r} is {value!r}; expected true or false")
    return value


def _enum(message: dict[str, Any], key: str, default: str, allowed: tuple[str, ...], where: str) -> str:
    value = str(_one(message, key, default, where))
    if value not in allowed:
        raise FirescaleError(f"{where}: {key!r} is {value!r}; expected one of {', '.join(allowed)}")
    return value


def _block(message: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = _one(message, key, {}, where)
    if not isinstance(value, dict):
        raise FirescaleError(f"{where}: {key!r} must be a block {{ ... }}, not {value!r}")
    return value


def _filler(message: dict[str, Any], key: str, where: str) -> Filler:
    block = _block(message, key, where)
    at = f"{where} {key}"
    return Filler(str(_one(block, "type", "constant", at)), _number(block, "value", 0.0, at),
                  _number(block, "std", 1.0, at), _number(block, "mean", 0.0, at), _number(block, "min", 0.0, at),
                  _number(block, "max", 1.0, at), str(_one(block, "variance_norm", "FAN_IN", at)))


def _pair(message: dict[str, Any], key: str, default: int, where: str, required: bool = False) -> tuple[int, int]:
    """A ConvolutionParameter/PoolingParameter size: `key_size` (or `key`, repeated per axis) or `key_h`/`key_w`."""
    size_key = "kernel_size" if key == "kernel" else key
    h_key, w_key = f"{key}_h", f"{key}_w"
    if h_key in message or w_key in message:
        if h_key not in message or w_key not in message or size_key in message:
            raise FirescaleError(f"{where}: give both {h_key!r} and {w_key!r}, or {size_key!r}, not a mixture")
        return _int(message, h_key, 0, where), _int(message, w_key, 0, where)
    values = _list(message.get(size_key))
    if not values:
        if required:
            raise FirescaleError(f"{where}: {size_key!r} is missing; expected the {key} size")
        return default, default
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values) or len(values) > 2:
        raise FirescaleError(f"{where}: {size_key!r} is {values!r}; expected one whole number, or one per axis")
    return (values[0], values[-1])


def _at_least(pair: tuple[int, int], key: str, least: int, where: str) -> tuple[int, int]:
    """A size pair whose values are each `least` or more; else one sentence naming the layer and the key."""
    if min(pair) < least:
        given = pair[0] if pair[0] == pair[1] else f"{pair[0]}x{pair[1]} (height x width)"
        raise FirescaleError(f"{where}: {key} is {given}; expected {least} or more")
    return pair


# ---------------------------------------------------------------- one layer


def _convolution(p: dict[str, Any], at: str) -> Convolution:
    """ConvolutionParameter with every size Caffe would accept: kernel, stride, dilation >= 1, pad >= 0."""
    group = _int(p, "group", 1, at)
    if group < 1:
        raise FirescaleError(f"{at}: group is {group}; expected 1 or more, dividing the input and output channels")
    kernel = _at_least(_pair(p, "kernel", 0, at, required=True), "kernel", 1, at)
    return Convolution(_int(p, "num_output", 0, at), kernel,
                       _at_least(_pair(p, "stride", 1, at), "stride", 1, at),
                       _at_least(_pair(p, "pad", 0, at), "pad", 0, at),
                       _at_least(_pair(p, "dilation", 1, at), "dilation", 1, at),
                       group, bool(_bool(p, "bias_term", True, at)),
                       _filler(p, "weight_filler", at), _filler(p, "bias_filler", at))


def _pooling(p: dict[str, Any], at: str) -> Pooling:
    """PoolingParameter as Caffe checks it: kernel and stride >= 1, 0 <= pad < kernel; global pooling takes
    neither a kernel nor a stride or pad of its own."""
    glob = bool(_bool(p, "global_pooling", False, at))
    pool = _enum(p, "pool", "MAX", ("MAX", "AVE", "STOCHASTIC"), at)
    round_mode = _enum(p, "round_mode", "CEIL", ("CEIL", "FLOOR"), at)
    kernel = _pair(p, "kernel", 0, at, required=not glob)
    stride, pad = _pair(p, "stride", 1, at), _pair(p, "pad", 0, at)
    if glob:
        if kernel != (0, 0) or stride != (1, 1) or pad != (0, 0):
            raise FirescaleError(f"{at}: global_pooling covers the whole input; expected no kernel, stride 1 and "
                                 f"pad 0, got kernel {kernel}, stride {stride}, pad {pad}")
        return Pooling(pool, kernel, stride, pad, glob, round_mode)
    _at_least(kernel, "kernel", 1, at)
    _at_least(stride, "stride", 1, at)
    _at_least(pad, "pad", 0, at)
    if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
        raise FirescaleError(f"{at}: pad {pad} is not smaller than the kernel {kernel}; a window would hold "
                             f"nothing but padding (Caffe requires pad < kernel)")
    return Pooling(pool, kernel, stride, pad, glob, round_mode)


def _eltwise(raw: dict[str, Any], where: str) -> EltwiseParam:
    """EltwiseParameter as Caffe checks it: two or more bottoms, one coeff per bottom, coeffs only for SUM."""
    p = _block(raw, "eltwise_param", where)
    coeffs = _list(p.get("coeff"))
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) for c in coeffs):
        raise FirescaleError(f"{where}: coeff is {coeffs!r}; expected numbers, one per bottom")
    operation = _enum(p, "operation", "SUM", ("SUM", "PROD", "MAX"), where)
    bottoms = len(_list(raw.get("bottom")))
    if bottoms < 2:
        raise FirescaleError(f"{where} reads {bottoms} blob(s); an Eltwise layer combines two or more")
    if coeffs and (len(coeffs) != bottoms or operation != "SUM"):
        raise FirescaleError(f"{where}: gives {len(coeffs)} coeff values for {bottoms} bottoms with operation "
                             f"{operation}; expected one coeff per bottom, and only with SUM")
    return EltwiseParam(operation, tuple(float(c) for c in coeffs))


def _settings(kind: str, raw: dict[str, Any], where: str) -> Settings | None:
    if kind == "Convolution":
        return _convolution(_block(raw, "convolution_param", where), f"{where} convolution_param")
    if kind == "Pooling":
        return _pooling(_block(raw, "pooling_param", where), f"{where} pooling_param")
    if kind == "InnerProduct":
        p = _block(raw, "inner_product_param", where)
        at = f"{where} inner_product_param"
        return InnerProductParam(_int(p, "num_output", 0, at), bool(_bool(p, "bias_term", True, at)),
                                 _filler(p, "weight_filler", at), _filler(p, "bias_filler", at), _int(p, "axis", 1, at))
    if kind == "LRN":
        p = _block(raw, "lrn_param", where)
        at = f"{where} lrn_param"
        size = _int(p, "local_size", 5, at)
        if size < 1 or size % 2 == 0:
            raise FirescaleError(f"{at}: local_size is {size}; expected an odd number, 1 or more (Caffe's LRN "
                                 f"centres its window)")
        return LRNParam(size, _number(p, "alpha", 1.0, at), _number(p, "beta", 0.75, at), _number(p, "k", 1.0, at),
                        _enum(p, "norm_region", "ACROSS_CHANNELS", ("ACROSS_CHANNELS", "WITHIN_CHANNEL"), at))
    if kind == "Dropout":
        ratio = _number(_block(raw, "dropout_param", where), "dropout_ratio", 0.5, where)
        if not 0.0 <= ratio < 1.0:
            raise FirescaleError(f"{where}: dropout_ratio is {ratio}; expected at least 0 and less than 1")
        return DropoutParam(ratio)
    if kind == "Concat":
        p = _block(raw, "concat_param", where)
        if len(_list(raw.get("bottom"))) < 2:
            raise FirescaleError(f"{where} reads {len(_list(raw.get('bottom')))} blob(s); firescale takes a Concat "
                                 f"as the merge of two or more branches")
        return ConcatParam(_int(p, "axis", _int(p, "concat_dim", 1, where), where))
    if kind == "Eltwise":
        return _eltwise(raw, where)
    if kind == "BatchNorm":
        p = _block(raw, "batch_norm_param", where)
        eps, fraction = _number(p, "eps", 1e-5, where), _number(p, "moving_average_fraction", 0.999, where)
        if not eps > 0 or not 0.0 <= fraction <= 1.0:
            raise FirescaleError(f"{where}: eps {eps} and moving_average_fraction {fraction}; expected eps above 0 "
                                 f"and a fraction from 0 to 1")
        return BatchNormParam(_bool(p, "use_global_stats", None, where), eps, fraction)
    if kind == "Scale":
        p = _block(raw, "scale_param", where)
        return ScaleParam(bool(_bool(p, "bias_term", False, where)), _int(p, "axis", 1, where),
                          _int(p, "num_axes", 1, where))
    if kind == "ReLU":
        return SimpleParam(negative_slope=_number(_block(raw, "relu_param", where), "negative_slope", 0.0, where))
    if kind in ("Softmax", "SoftmaxWithLoss"):
        return SimpleParam(axis=_int(_block(raw, "softmax_param", where), "axis", 1, where))
    if kind == "Flatten":
        return SimpleParam(axis=_int(_block(raw, "flatten_param", where), "axis", 1, where))
    if kind == "Accuracy":
        top_k = _int(_block(raw, "accuracy_param", where), "top_k", 1, where)
        if top_k < 1:
            raise FirescaleError(f"{where}: top_k is {top_k}; expected 1 or more")
        return SimpleParam(top_k=top_k)
    if kind in DATA_TYPES:
        return _data(kind, raw, where)
    return None


def _data(kind: str, raw: dict[str, Any], where: str) -> DataParam:
    """The source, batch, transform and (when the file gives it) image shape of a data layer."""
    transform = _block(raw, "transform_param", where)
    at = f"{where} transform_param"
    crop = _int(transform, "crop_size", 0, at)
    if crop < 0:
        raise FirescaleError(f"{at}: crop_size is {crop}; expected 0 (no crop) or more")
    means = _list(transform.get("mean_value"))
    if any(isinstance(m, bool) or not isinstance(m, (int, float)) for m in means):
        raise FirescaleError(f"{at}: 'mean_value' is {means!r}; expected numbers, one or one per channel")
    mean_file = str(_one(transform, "mean_file", "", at))
    if means and mean_file:
        raise FirescaleError(f"{at}: gives both 'mean_file' and 'mean_value'; Caffe takes one of them")
    kept: dict[str, Any] = {"scale": _number(transform, "scale", 1.0, at),
                            "mean_value": tuple(float(m) for m in means), "mean_file": mean_file,
                            "mirror": bool(_bool(transform, "mirror", False, at))}
    if kind == "Input":
        shapes = _list(_block(raw, "input_param", where).get("shape"))
        if len(shapes) < 1 or not isinstance(shapes[0], dict):
            raise FirescaleError(f"{where}: an Input layer needs input_param {{ shape {{ dim: N dim: C dim: H "
                                 f"dim: W }} }}")
        dims = _list(shapes[0].get("dim"))
        if len(dims) != 4 or not all(isinstance(d, int) and d > 0 for d in dims):
            raise FirescaleError(f"{where}: input_param shape has dims {dims}; expected four, each 1 or more: "
                                 "N, C, H, W")
        return DataParam("", dims[0], (dims[2], dims[3], dims[1]))
    if kind == "ImageData":
        p = _block(raw, "image_data_param", where)
        channels = 3 if _bool(p, "is_color", True, where) else 1
        h, w = _int(p, "new_height", 0, where), _int(p, "new_width", 0, where)
        if min(h, w) < 0 or _int(p, "batch_size", 1, where) < 1:
            raise FirescaleError(f"{where}: new_height {h}, new_width {w}, batch_size {p.get('batch_size')}; "
                                 f"expected sizes of 0 (as stored) or more and a batch of 1 or more")
        shape = (crop, crop, channels) if crop else ((h, w, channels) if h and w else None)
        return DataParam(str(_one(p, "source", "", where)), _int(p, "batch_size", 0, where), shape, crop, **kept)
    key = "data_param" if kind == "Data" else "hdf5_data_param"
    p = _block(raw, key, where)
    if _int(p, "batch_size", 1, where) < 1:
        raise FirescaleError(f"{where}: batch_size is {p['batch_size']}; expected 1 or more")
    # A Data layer's records carry their own size; the file gives it only as a crop (colour unless one mean).
    shape = (crop, crop, 1 if len(means) == 1 else 3) if crop and kind == "Data" else None
    return DataParam(str(_one(p, "source", "", where)), _int(p, "batch_size", 0, where), shape, crop, **kept)


def _in_phase(raw: dict[str, Any], phase: str, where: str) -> bool:
    """Caffe's NetStateRule for a phase: any `include` rule that matches, else no `exclude` rule that does."""
    def matches(rule: Any) -> bool:
        if not isinstance(rule, dict):
            raise FirescaleError(f"{where}: include/exclude must be a block {{ phase: TRAIN }}, not {rule!r}")
        other = set(rule) - {"phase"}
        if other:
            raise FirescaleError(f"{where}: include/exclude uses {', '.join(sorted(other))}; firescale "
                                 f"chooses layers by phase only")
        return "phase" not in rule or str(rule["phase"]) == phase
    includes, excludes = _list(raw.get("include")), _list(raw.get("exclude"))
    if includes and excludes:
        raise FirescaleError(f"{where}: gives both include and exclude rules; Caffe takes one kind")
    if "phase" in raw and str(raw["phase"]) != phase:
        return False
    if includes:
        return any(matches(rule) for rule in includes)
    return not any(matches(rule) for rule in excludes)


def _params(raw: dict[str, Any], v1: bool, where: str) -> tuple[ParamSpec, ...]:
    if v1:
        lrs, decays = _list(raw.get("blobs_lr")), _list(raw.get("weight_decay"))
        if "param" in raw and any(not isinstance(p, str) for p in _list(raw["param"])):
            raise FirescaleError(f"{where}: a V1 layer names shared blobs with param: \"name\", not blocks")
        for key, values in (("blobs_lr", lrs), ("weight_decay", decays)):
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
            if bad:
                raise FirescaleError(f"{where}: {key!r} is {bad[0]!r}; expected a number per blob")
        return tuple(ParamSpec(float(lrs[i]) if i < len(lrs) else 1.0, float(decays[i]) if i < len(decays) else 1.0)
                     for i in range(max(len(lrs), len(decays))))
    out = []
    for p in _list(raw.get("param")):
        if not isinstance(p, dict):
            raise FirescaleError(f"{where}: param must be a block {{ lr_mult: 1 decay_mult: 1 }}, not {p!r}")
        out.append(ParamSpec(_number(p, "lr_mult", 1.0, where), _number(p, "decay_mult", 1.0, where)))
    return tuple(out)


def _layer(raw: Any, v1: bool, index: int, source: str) -> CaffeLayer:
    if not isinstance(raw, dict):
        raise FirescaleError(f"{source}: layer {index} must be a block {{ name: ... type: ... }}")
    if "layer" in raw:
        raise FirescaleError(f"{source}: layer {index} is in Caffe's V0 format (a layer inside layers); "
                             f"upgrade it with Caffe's upgrade_net_proto_text")
    name = str(raw.get("name", f"layer {index}"))
    where = f"{source}: layer {name!r}"
    kind = str(raw.get("type", ""))
    if v1:
        kind = V1_TYPES.get(kind, kind)
    if kind not in LAYER_TYPES:
        raise FirescaleError(f"{where} has type {kind!r}, which firescale does not support; supported: "
                             f"{', '.join(LAYER_TYPES)}" + (f" (V1: {', '.join(V1_TYPES)})" if v1 else ""))
    bottom = tuple(str(b) for b in _list(raw.get("bottom")))
    top = tuple(str(t) for t in _list(raw.get("top")))
    where = f"{where} ({kind})"
    return CaffeLayer(name, kind, bottom, top, _params(raw, v1, where), _settings(kind, raw, where),
                      tuple(float(w) for w in _list(raw.get("loss_weight"))))


def _inputs(raw: dict[str, Any], source: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The top-level `input` blobs with `input_shape { dim }` or four `input_dim` each (N, C, H, W)."""
    names = [str(n) for n in _list(raw.get("input"))]
    if not names:
        return ()
    shapes: list[tuple[int, ...]] = []
    if "input_shape" in raw:
        shapes = [tuple(_list(s.get("dim")) if isinstance(s, dict) else ()) for s in _list(raw["input_shape"])]
    elif "input_dim" in raw:
        dims = _list(raw["input_dim"])
        shapes = [tuple(dims[i:i + 4]) for i in range(0, len(dims), 4)]
    if len(shapes) != len(names) or any(len(s) != 4 or not all(isinstance(d, int) and d > 0 for d in s)
                                        for s in shapes):
        raise FirescaleError(f"{source}: the net's inputs {', '.join(names)} need one shape each, four positive dims "
                             f"(N, C, H, W) in input_shape {{ dim: ... }} or input_dim")
    return tuple(zip(names, shapes))


def parse_net(text: str, source: str, phase: str = "TRAIN") -> CaffeNetFile:
    """A net file's text as the layers of `phase` (TRAIN or TEST), V1 `layers` read as today's `layer`."""
    if phase not in PHASES:
        raise FirescaleError(f"{source}: phase {phase!r} is not one of {', '.join(PHASES)}")
    raw = parse_prototxt(text, source, net=True)
    if "layer" in raw and "layers" in raw:
        raise FirescaleError(f"{source}: mixes 'layer' blocks and V1 'layers' blocks; Caffe takes one kind")
    unknown = set(raw) - {"name", "input", "input_shape", "input_dim", "layer", "layers"} - _IGNORED_NET_KEYS
    if unknown:
        raise FirescaleError(f"{source}: {', '.join(sorted(unknown))} is not a field of a Caffe net file")
    v1 = "layers" in raw
    layers = [_layer(r, v1, i, source) for i, r in enumerate(_list(raw.get("layers" if v1 else "layer")))]
    if not layers:
        raise FirescaleError(f"{source}: has no layers; expected 'layer {{ ... }}' blocks")
    kept = tuple(layer for layer, r in zip(layers, _list(raw.get("layers" if v1 else "layer")))
                 if _in_phase(r, phase, f"{source}: layer {layer.name!r}"))
    net = CaffeNetFile(str(raw.get("name", Path(source).stem)), source, cast(Phase, phase), kept,
                       _inputs(raw, source), v1)
    check_blobs(net)
    return net


def read_net(path: str | Path | Traversable, phase: str = "TRAIN") -> CaffeNetFile:
    """The net file at `path` (a path, or a file shipped in the package), read for `phase`."""
    if isinstance(path, str):
        path = Path(path)
    return parse_net(read_user_text(path, "net file"), str(path), phase)


# ---------------------------------------------------------------- the blobs form a DAG


def check_blobs(net: CaffeNetFile) -> None:
    """Refuse a layer reading a blob that no earlier layer writes: missing, or written later (a cycle or an
    order Caffe cannot run), one sentence naming the file, the layer and the blob."""
    written: set[str] = {name for name, _ in net.inputs}
    writers: dict[str, list[int]] = {}
    for i, layer in enumerate(net.layers):
        for t in layer.top:
            writers.setdefault(t, []).append(i)
    for i, layer in enumerate(net.layers):
        for b in layer.bottom:
            if b in written:
                continue
            later = [j for j in writers.get(b, []) if j > i]
            if not later:
                raise FirescaleError(f"{net.source}: layer {layer.name!r} ({layer.type}) reads blob {b!r}, which no "
                                     f"layer of the {net.phase} phase writes; expected the top of an earlier layer")
            if _depends_on(net, later[0], i, writers):
                raise FirescaleError(f"{net.source}: layer {layer.name!r} ({layer.type}) reads blob {b!r}, which "
                                     f"layer {net.layers[later[0]].name!r} writes from {layer.name!r}'s own output: "
                                     f"a cycle; expected a net whose blobs flow one way")
            raise FirescaleError(f"{net.source}: layer {layer.name!r} ({layer.type}) reads blob {b!r} before layer "
                                 f"{net.layers[later[0]].name!r} writes it; expected the layers in the order they run")
        written.update(layer.top)


def _depends_on(net: CaffeNetFile, start: int, target: int, writers: dict[str, list[int]]) -> bool:
    """Whether layer `start` reads, through any chain of blobs, an output of layer `target`."""
    seen, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i == target:
            return True
        if i in seen:
            continue
        seen.add(i)
        for b in net.layers[i].bottom:
            stack.extend(j for j in writers.get(b, []) if j not in seen)
    return False
