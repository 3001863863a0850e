"""A Caffe net file as a NetSpec: its layer DAG decomposed into a chain of layers and series-parallel blocks."""
# The rules (docs/nets.md):
# - the net's output is the layer named by `output`, else the last SoftmaxWithLoss of the phase, else the
#   last layer whose top nothing reads; layers that do not lead to it (Accuracy, GoogLeNet's auxiliary
#   classifiers) are left out and named in the spec's notes;
# - where a blob is read by several layers, the branches must meet again in one Concat (along channels)
#   or Eltwise (SUM, PROD, MAX) that reads exactly their ends; a branch that is the blob itself is the
#   identity (a residual shortcut).  Any other DAG is refused, naming the layer where it fails;
# - Split layers are aliases; in-place layers (bottom == top) follow their bottom.
from __future__ import annotations

from dataclasses import dataclass, replace
from importlib.resources.abc import Traversable
from pathlib import Path

from firescale.caffe.net import (
    DATA_TYPES,
    BatchNormParam,
    CaffeLayer,
    CaffeNetFile,
    ConcatParam,
    Convolution,
    DataParam,
    DropoutParam,
    EltwiseParam,
    Filler,
    InnerProductParam,
    LRNParam,
    Pooling,
    ScaleParam,
    SimpleParam,
    read_net,
)
from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    XAVIER,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    Flatten,
    Init,
    Layer,
    MergeMode,
    NetSpec,
    Pool,
    ReLU,
    Scale,
    Shape,
    Sigmoid,
    Softmax,
    TanH,
    constant,
    gaussian,
    output_shape,
)

_MERGES: dict[str, MergeMode] = {"SUM": "sum", "PROD": "prod", "MAX": "max"}


@dataclass
class _Graph:
    """The phase's layers as nodes: the blob versions each reads and the one it writes."""

    net: CaffeNetFile
    reads: dict[int, list[str]]
    writes: dict[int, str]
    producer: dict[str, int]
    image: str
    shape: Shape | None

    def where(self, i: int) -> str:
        layer = self.net.layers[i]
        return f"{self.net.source}: layer {layer.name!r} ({layer.type})"


def _graph(net: CaffeNetFile) -> _Graph:
    """Blob versions: every top is a new version, so that in-place layers chain; Split tops alias their bottom."""
    version: dict[str, str] = {}
    count: dict[str, int] = {}
    labels: set[str] = set()
    image: str | None = None
    shape: Shape | None = None

    def new(blob: str) -> str:
        count[blob] = count.get(blob, 0) + 1
        version[blob] = f"{blob}@{count[blob]}"
        return version[blob]

    for k, (blob, (_, c, h, w)) in enumerate(net.inputs):
        node = new(blob)
        if k == 0:
            image, shape = node, (h, w, c)
        else:
            labels.add(node)
    reads: dict[int, list[str]] = {}
    writes: dict[int, str] = {}
    producer: dict[str, int] = {}
    for i, layer in enumerate(net.layers):
        where = f"{net.source}: layer {layer.name!r} ({layer.type})"
        if layer.type in DATA_TYPES:
            if image is not None:
                raise FirescaleError(f"{where} is a second input of the {net.phase} phase; expected one data "
                                     f"layer or top-level input per phase")
            if not layer.top:
                raise FirescaleError(f"{where} has no top; expected the images' blob (and the labels')")
            image = new(layer.top[0])
            labels.update(new(t) for t in layer.top[1:])
            assert isinstance(layer.settings, DataParam)
            shape = layer.settings.shape
            continue
        ins = [version[b] for b in layer.bottom]
        if layer.type == "Split":
            if len(ins) != 1:
                raise FirescaleError(f"{where} reads {len(ins)} blobs; a Split copies exactly one bottom to its tops")
            for t in layer.top:
                version[t] = ins[0]
            continue
        if layer.type in ("SoftmaxWithLoss", "Accuracy"):
            ins = [n for n in ins if n not in labels]
        elif any(n in labels for n in ins):
            raise FirescaleError(f"{where} reads the labels; only SoftmaxWithLoss and Accuracy may")
        if not ins:
            raise FirescaleError(f"{where} reads no blob; expected a bottom")
        if len(layer.top) > 1 and layer.type != "Accuracy":
            raise FirescaleError(f"{where} writes {len(layer.top)} tops; expected one")
        reads[i] = ins
        writes[i] = new(layer.top[0]) if layer.top else f"{layer.name}@out"
        producer[writes[i]] = i
    if image is None:
        raise FirescaleError(f"{net.source}: the {net.phase} phase has no input; expected a data layer "
                             f"(Data, ImageData, HDF5Data, Input) or a top-level input")
    return _Graph(net, reads, writes, producer, image, shape)


def _output(g: _Graph, output: str | None) -> int:
    net = g.net
    if output is not None:
        for i in g.reads:
            if net.layers[i].name == output:
                return i
        raise FirescaleError(f"{net.source}: the {net.phase} phase has no layer {output!r} to take as the output")
    losses = [i for i in g.reads if net.layers[i].type == "SoftmaxWithLoss"]
    if losses:
        return losses[-1]
    read = {n for ins in g.reads.values() for n in ins}
    sinks = [i for i in g.reads if g.writes[i] not in read and net.layers[i].type != "Accuracy"]
    if not sinks:
        raise FirescaleError(f"{net.source}: no layer of the {net.phase} phase is an output")
    return sinks[-1]


def _ancestors(g: _Graph, out: int) -> set[int]:
    kept, stack = set(), [out]
    while stack:
        i = stack.pop()
        if i in kept:
            continue
        kept.add(i)
        stack.extend(g.producer[n] for n in g.reads[i] if n in g.producer)
    return kept


# ---------------------------------------------------------------- one layer


def _init(f: Filler, what: str, where: str) -> Init:
    if f.type == "constant":
        return constant(f.value)
    if f.type == "gaussian" and f.mean == 0.0:
        return gaussian(f.std)
    if f.type in ("xavier", "msra") and f.variance_norm == "FAN_IN":
        return XAVIER if f.type == "xavier" else Init("msra")
    raise FirescaleError(f"{where}: {what} {{ type: {f.type!r} }} (mean {f.mean}, variance_norm {f.variance_norm}) "
                         f"is not one firescale fills; expected constant, gaussian with mean 0, or xavier or msra "
                         f"with FAN_IN")


def _width(pair: tuple[int, int]) -> int | None:
    """The width's value when it differs from the height's (else None: one value for both axes)."""
    return None if pair[1] == pair[0] else pair[1]


def _square(pair: tuple[int, int], what: str, where: str) -> int:
    if pair[0] != pair[1]:
        raise FirescaleError(f"{where}: {what} {pair[0]}x{pair[1]} differs per axis; firescale takes one {what} "
                             f"for both axes here (expected {what}_h equal to {what}_w)")
    return pair[0]


def _layer(layer: CaffeLayer, where: str) -> Layer:
    s, name = layer.settings, layer.name
    if isinstance(s, Convolution):
        dilation = _square(s.dilation, "dilation", where)
        if s.num_output < 1:
            raise FirescaleError(f"{where}: num_output is {s.num_output}; expected at least 1")
        return Conv(name, s.num_output, s.kernel[0], s.stride[0], s.pad[0], s.group,
                    _init(s.weight_filler, "weight_filler", where), _init(s.bias_filler, "bias_filler", where),
                    s.bias_term, _width(s.kernel), _width(s.stride), _width(s.pad), dilation)
    if isinstance(s, Pooling):
        if s.pool == "STOCHASTIC":
            raise FirescaleError(f"{where}: pool STOCHASTIC is not supported; expected MAX or AVE")
        kernel = 0 if s.global_pooling else _square(s.kernel, "kernel", where)
        return Pool(name, "max" if s.pool == "MAX" else "avg", kernel, _square(s.stride, "stride", where),
                    _square(s.pad, "pad", where), s.global_pooling, "ceil" if s.round_mode == "CEIL" else "floor")
    if isinstance(s, InnerProductParam):
        if s.axis != 1:
            raise FirescaleError(f"{where}: axis {s.axis} is not supported; expected 1 (flatten C, H, W)")
        if s.num_output < 1:
            raise FirescaleError(f"{where}: num_output is {s.num_output}; expected at least 1")
        return FC(name, s.num_output, _init(s.weight_filler, "weight_filler", where),
                  _init(s.bias_filler, "bias_filler", where), s.bias_term)
    if isinstance(s, LRNParam):
        return LRN(name, s.local_size, s.alpha, s.beta, s.k, s.norm_region == "WITHIN_CHANNEL")
    if isinstance(s, DropoutParam):
        return Dropout(name, s.ratio)
    if isinstance(s, BatchNormParam):
        return BatchNorm(name, s.eps, s.use_global_stats)
    if isinstance(s, ScaleParam):
        if (s.axis, s.num_axes) != (1, 1):
            raise FirescaleError(f"{where}: axis {s.axis}, num_axes {s.num_axes} is not supported; expected a "
                                 f"scale per channel (axis 1, num_axes 1)")
        return Scale(name, s.bias_term)
    if layer.type in ("Sigmoid", "TanH"):
        return Sigmoid(name) if layer.type == "Sigmoid" else TanH(name)
    assert isinstance(s, SimpleParam), layer.type
    if layer.type == "ReLU":
        if s.negative_slope != 0.0:
            raise FirescaleError(f"{where}: negative_slope {s.negative_slope} (a leaky ReLU) is not supported; "
                                 f"expected 0")
        return ReLU(name)
    if s.axis != 1:
        raise FirescaleError(f"{where}: axis {s.axis} is not supported; expected 1 (the channels)")
    if layer.type == "Flatten":
        return Flatten(name)
    if layer.type in ("Softmax", "SoftmaxWithLoss"):
        return Softmax(name, loss=layer.type == "SoftmaxWithLoss")
    raise FirescaleError(f"{where}: a {layer.type} layer cannot be part of the net's chain of layers")


# ---------------------------------------------------------------- series-parallel decomposition


class _Decomposer:
    def __init__(self, g: _Graph, kept: set[int]) -> None:
        self.g = g
        self.consumers: dict[str, list[int]] = {}
        for i in sorted(kept):
            for n in g.reads[i]:
                if i not in self.consumers.setdefault(n, []):
                    self.consumers[n].append(i)

    def chain(self, node: str) -> tuple[list[Layer], str]:
        """Layers from blob version `node` on, up to a blob whose reader is a merge (or nothing reads it)."""
        g = self.g
        out: list[Layer] = []
        while True:
            readers = self.consumers.get(node, [])
            if not readers:
                return out, node
            if len(readers) == 1:
                i = readers[0]
                if len(g.reads[i]) > 1:
                    return out, node
                out.append(_layer(g.net.layers[i], g.where(i)))
                node = g.writes[i]
                continue
            block, node = self.fan_out(node, readers)
            out.append(block)

    def fan_out(self, node: str, readers: list[int]) -> tuple[Branches, str]:
        """The branches from `node` to the one Concat or Eltwise where they meet."""
        g = self.g
        ends: list[tuple[tuple[Layer, ...], str, int]] = []
        for i in readers:
            if len(g.reads[i]) > 1:         # the merge reads the blob itself: an identity branch
                ends.append(((), node, i))
                continue
            layers, end = self.chain(g.writes[i])
            layers.insert(0, _layer(g.net.layers[i], g.where(i)))
            merge = self.consumers.get(end, [])
            if len(merge) != 1:
                raise FirescaleError(f"{g.where(i)} starts a branch from blob {node.split('@')[0]!r} that "
                                     f"does not end in one Concat or Eltwise; firescale takes nets whose branches "
                                     f"meet again in one merge layer (series-parallel)")
            ends.append((tuple(layers), end, merge[0]))
        merges = sorted({m for _, _, m in ends})
        if len(merges) != 1:
            names = ", ".join(repr(g.net.layers[m].name) for m in merges)
            raise FirescaleError(f"{g.net.source}: the branches from blob {node.split('@')[0]!r} end in several "
                                 f"layers ({names}); firescale takes nets whose branches meet again in one merge "
                                 f"layer (series-parallel)")
        m = merges[0]
        pending = list(ends)
        ordered: list[tuple[Layer, ...]] = []
        for n in g.reads[m]:
            match = next((e for e in pending if e[1] == n), None)
            if match is None:
                raise FirescaleError(f"{g.where(m)} reads blob {n.split('@')[0]!r}, which does not come from the "
                                     f"branches split at blob {node.split('@')[0]!r}; firescale takes nets whose "
                                     f"branches split from one blob and meet again (series-parallel)")
            pending.remove(match)
            ordered.append(match[0])
        if pending:
            raise FirescaleError(f"{g.where(m)} does not read every branch split at blob "
                                 f"{node.split('@')[0]!r}; expected it to merge all of them")
        return _block(g.net.layers[m], g.where(m), ordered), g.writes[m]


def _block(merge: CaffeLayer, where: str, branches: list[tuple[Layer, ...]]) -> Branches:
    s = merge.settings
    if isinstance(s, ConcatParam):
        if s.axis != 1:
            raise FirescaleError(f"{where}: axis {s.axis} is not supported; expected 1 (concatenate channels)")
        mode: MergeMode = "concat"
    elif isinstance(s, EltwiseParam):
        if any(c != 1.0 for c in s.coeff):
            raise FirescaleError(f"{where}: coeff {list(s.coeff)} is not supported; expected none (all 1)")
        mode = _MERGES[s.operation]
    else:
        raise FirescaleError(f"{where} reads {len(merge.bottom)} blobs; firescale merges branches only in "
                             f"Concat and Eltwise layers")
    name = merge.name
    prefix = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
    if prefix and all(layer.name.startswith(prefix) for branch in branches for layer in branch):
        # GoogLeNet's inception_3a/1x1 inside block inception_3a: the records keep Caffe's names.
        name = prefix[:-1]
        branches = [tuple(replace(layer, name=layer.name[len(prefix):]) for layer in b) for b in branches]
    return Branches(name, tuple(branches), mode)


def _with_classes(layers: list[Layer], classes: int, source: str) -> list[Layer]:
    """The layers with the last InnerProduct (else the last Convolution) giving `classes` outputs."""
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        if isinstance(layer, (FC, Conv)):
            return [*layers[:k], replace(layer, out=classes), *layers[k + 1:]]
        if isinstance(layer, Branches):
            break
    raise FirescaleError(f"{source}: no InnerProduct or Convolution after the last branches gives the classes; "
                         f"the class count cannot be changed")


# ---------------------------------------------------------------- the whole file


def spec_from_net(net: CaffeNetFile, *, input_shape: Shape | None = None, num_classes: int | None = None,
                  output: str | None = None, name: str | None = None) -> NetSpec:
    """`net` as a NetSpec reading `input_shape` (default: the file's) with `num_classes` outputs (default:
    the file's last InnerProduct or Convolution); `output` names the layer to end at (default above)."""
    g, layers, notes = _structure(net, output)
    shape = input_shape if input_shape is not None else g.shape
    if shape is None:
        data = next((layer for layer in net.layers if layer.type in DATA_TYPES), None)
        what = f"the data layer {data.name!r} ({data.type})" if data else "the net"
        raise FirescaleError(f"{net.source}: {what} does not give the image size (no crop_size or shape); "
                             f"expected the input shape as H,W,C (--input)")
    if num_classes is not None:
        layers = _with_classes(layers, int(num_classes), net.source)
    title = name or net.name
    try:
        final = output_shape(title, shape, tuple(layers))
    except FirescaleError as exc:
        raise FirescaleError(f"{net.source}: {exc}") from None
    return NetSpec(title, shape, final[2], tuple(layers), f"Caffe's fillers as {Path(net.source).name} gives them",
                   net.source, notes)


def _structure(net: CaffeNetFile, output: str | None) -> tuple[_Graph, list[Layer], tuple[str, ...]]:
    """The graph, its layers as a chain of layers and blocks, and the notes on what was left out."""
    g = _graph(net)
    out = _output(g, output)
    kept = _ancestors(g, out)
    layers, end = _Decomposer(g, kept).chain(g.image)
    if end != g.writes[out]:
        stuck = next((i for i in sorted(kept) if end in g.reads[i]), out)
        raise FirescaleError(f"{g.where(stuck)} merges blobs that do not split from one blob; firescale takes "
                             f"nets whose branches split from one blob and meet again (series-parallel)")
    return g, layers, _left_out(g, kept, out)


def check_net_file(path: str | Path, *, input_shape: Shape | None = None,
                   num_classes: int | None = None) -> NetSpec | None:
    """Refuse what `load_net_file` refuses in the net file at `path`: its NetSpec when the input shape is known
    (given, or the file's own); else the layers and their DAG only, None (shapes wait for the input's)."""
    net = read_net(path)
    if input_shape is None and _structure(net, None)[0].shape is None:
        return None
    return spec_from_net(net, input_shape=input_shape, num_classes=num_classes)


def _left_out(g: _Graph, kept: set[int], out: int) -> tuple[str, ...]:
    layers = g.net.layers
    others = [i for i in g.reads if i not in kept and layers[i].type != "Accuracy"]
    notes = []
    if others:
        heads = [layers[i].name for i in others if layers[i].type == "SoftmaxWithLoss"]
        notes.append(f"left out {len(others)} layers that do not lead to the output {layers[out].name!r}"
                     + (f", the heads {', '.join(heads)}" if heads else "")
                     + f" (first: {layers[others[0]].name!r}); name one as the output to cost it")
    metrics = [layers[i].name for i in g.reads if layers[i].type == "Accuracy"]
    if metrics:
        notes.append(f"Accuracy layers {', '.join(metrics)} are metrics, not costed")
    return tuple(notes)


def load_net_file(path: str | Path | Traversable, *, phase: str = "TRAIN", input_shape: Shape | None = None,
                  num_classes: int | None = None, output: str | None = None) -> NetSpec:
    """The net file at `path` (its `phase`) as a NetSpec; see `spec_from_net`."""
    return spec_from_net(read_net(path, phase), input_shape=input_shape, num_classes=num_classes, output=output)
