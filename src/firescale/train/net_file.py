"""What training takes from a Caffe net file beyond its NetSpec: the net chosen, its blobs' multipliers, its phases."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from firescale.caffe.net import DATA_TYPES, BatchNormParam, CaffeNetFile, ParamSpec, read_net
from firescale.caffe.solver import NET_FILE_KEYS, TEST_NET_KEY, SolverConfig
from firescale.errors import FirescaleError
from firescale.nets.spec import FC, Branches, Conv, Layer, NetSpec
from firescale.train.caffe_weights import caffe_names

if TYPE_CHECKING:
    from firescale.train.tensorflow.nets import ParamInfo


@dataclass(frozen=True)
class ChosenNet:
    """The net a run trains: `--net`, else the solver's `net:`; `note` is the one line saying why, or ''."""

    name: str
    note: str = ""


def choose_net(net: str | None, solver_cfg: SolverConfig, solver_file: Path) -> ChosenNet:
    """`--net` when given (a solver's `net:` naming another file is then set aside, said in the note); else the
    solver's `net:` (or `train_net:`), relative to the solver file's folder, else to the working directory as
    Caffe resolves it; neither: an error."""
    key = next((k for k in NET_FILE_KEYS if isinstance(solver_cfg.ignored.get(k), str)), None)
    written = str(solver_cfg.ignored[key]) if key else ""
    if net:
        if written and Path(written).name != Path(net).name:
            return ChosenNet(net, f"--net {net} is trained; the solver's {key}: {written!r} is set aside")
        return ChosenNet(net)
    if not written or key is None:
        raise FirescaleError(f"{solver_file}: no --net and no net: line in the solver; give --net NAME or "
                             f"--net path/to/train_val.prototxt, or a net: \"path\" in the solver")
    path = _solver_file_path(solver_file, key, written)
    return ChosenNet(str(path), f"the solver's {key}: {written!r} is trained: {path}")


def _solver_file_path(solver_file: Path, key: str, written: str) -> Path:
    """A net file a solver names: relative to the solver file's folder, else to the working directory as Caffe
    resolves it; neither: an error naming both."""
    beside, here = Path(solver_file).parent / written, Path(written)
    for path in (beside, here):
        if path.is_file():
            return path
    raise FirescaleError(f"{solver_file}: {key}: {written!r} names no file ({beside} beside the solver, or {here} "
                         f"from the working directory); expected a Caffe net file")


def test_net_path(solver_cfg: SolverConfig, solver_file: Path) -> Path | None:
    """The solver's one `test_net:` file, found as its `net:` is; None without one (several test nets, each
    with its own test_iter, are not read: the test split is evaluated whole, as the solver module says)."""
    written = solver_cfg.ignored.get(TEST_NET_KEY)
    return _solver_file_path(solver_file, TEST_NET_KEY, written) if isinstance(written, str) else None


test_net_path.__test__ = False  # type: ignore[attr-defined]  # a function, not a pytest test, where imported


def check_test_net(spec: NetSpec, test_net: Path) -> None:
    """Refuse a solver's test_net whose learnable layers (names and blob shapes) differ from the trained net's:
    Caffe shares the trained weights with the test net by layer name, and firescale evaluates the trained net."""
    from firescale.nets.caffe_file import spec_from_net
    from firescale.train.caffe_weights import caffe_layouts

    trained = spec.source or repr(spec.name)
    try:
        other = spec_from_net(read_net(test_net, "TEST"), input_shape=spec.input_shape, name=spec.name)
        theirs = {name: [b.caffe_shape for b in blobs] for name, blobs in caffe_layouts(other).items()}
    except FirescaleError as exc:
        raise FirescaleError(f"{test_net}: the solver's test_net is not a net firescale can evaluate on the trained "
                             f"net {trained}'s input: {exc}") from None
    ours = {name: [b.caffe_shape for b in blobs] for name, blobs in caffe_layouts(spec).items()}
    if ours == theirs:
        return
    name = next(n for n in [*ours, *theirs] if ours.get(n) != theirs.get(n))
    def shown(blobs: list[tuple[int, ...]] | None) -> str:
        return "absent" if blobs is None else " and ".join("x".join(map(str, b)) for b in blobs)
    raise FirescaleError(f"{test_net}: the solver's test_net differs from the trained net {trained} in the learnable "
                         f"layer {name!r} (blobs {shown(theirs.get(name))} against {shown(ours.get(name))}); expected "
                         f"the same learnable layers, which Caffe shares between the nets by name")


@dataclass(frozen=True)
class NetFileSettings:
    """A net file's SHA-256, each Caffe layer's `param` blocks, BatchNorm's moving-average fractions (by the
    trainer's layer name) and one line on how its data layers map to the dataset."""

    source: str
    sha256: str
    params: dict[str, tuple[ParamSpec, ...]]
    moving_average: dict[str, float]
    data: str


def net_file_settings(spec: NetSpec, test_net: Path | None = None) -> NetFileSettings | None:
    """The settings of the Caffe file `spec` was read from (None for a built-in net); refuses a TEST phase whose
    net differs from the TRAIN phase's, since both are trained and evaluated as one net.  With a solver's
    `test_net` (see `check_test_net`) that file's TEST phase is the test net instead."""
    if not spec.source:
        return None
    train = read_net(spec.source, "TRAIN")
    test = read_net(test_net, "TEST") if test_net is not None else read_net(spec.source, "TEST")
    if test_net is None:
        _same_net(spec, test)
    names = {caffe: ours for ours, caffe in caffe_names(spec).items()}
    fractions = {names[layer.name]: layer.settings.moving_average_fraction for layer in train.layers
                 if isinstance(layer.settings, BatchNormParam) and layer.name in names}
    data = "; ".join(_data_line(net, split) for net, split in ((train, "train"), (test, "test")))
    return NetFileSettings(spec.source, hashlib.sha256(Path(spec.source).read_bytes()).hexdigest(),
                           {layer.name: layer.params for layer in train.layers}, fractions, data)


def _same_net(spec: NetSpec, test: CaffeNetFile) -> None:
    from firescale.nets.caffe_file import spec_from_net

    try:
        other = spec_from_net(test, input_shape=spec.input_shape, name=spec.name)
    except FirescaleError as exc:
        raise FirescaleError(f"{spec.source}: its TEST phase is not a net firescale can evaluate: {exc}") from None
    if other.layers != spec.layers:
        ours, theirs = _flat(spec.layers), _flat(other.layers)
        pairs = [(a, b) for a, b in zip(ours, theirs) if a != b]
        leaves = [a for a, b in pairs if not isinstance(a, Branches) or not isinstance(b, Branches)]
        longer = ours if len(ours) > len(theirs) else theirs
        at = (leaves or [a for a, _ in pairs] or [longer[min(len(ours), len(theirs))]])[0].name
        raise FirescaleError(f"{spec.source}: the TEST phase's net differs from the TRAIN phase's at layer {at!r}; "
                             f"firescale evaluates the TRAIN phase's net on the test split (expected the phases to "
                             f"differ only in their data, Accuracy and loss layers)")


def _flat(layers: tuple[Layer, ...]) -> list[Layer]:
    out: list[Layer] = []
    for layer in layers:
        out.append(layer)
        if isinstance(layer, Branches):
            out.extend(x for branch in layer.branches for x in _flat(branch))
    return out


def _data_line(net: CaffeNetFile, split: str) -> str:
    data = next((layer for layer in net.layers if layer.type in DATA_TYPES), None)
    if data is None:
        return f"the {net.phase} phase's input reads --dataset's {split} split"
    return f"the {net.phase} data layer {data.name!r} ({data.type}) reads --dataset's {split} split"


def check_classes(spec: NetSpec, classes: int, dataset: Path) -> None:
    """Refuse a net file whose last InnerProduct (or Convolution) gives another count than the dataset's classes."""
    if spec.num_classes == classes:
        return
    last = next((layer for layer in reversed(_flat(spec.layers)) if isinstance(layer, (FC, Conv))), None)
    what = f"its last {'InnerProduct' if isinstance(last, FC) else 'Convolution'} {last.name!r}" if last else "it"
    raise FirescaleError(f"{spec.source}: {what} gives {spec.num_classes} outputs, but dataset {dataset} has "
                         f"{classes} classes; expected them to agree (set its num_output to {classes})")


def blob_multipliers(spec: NetSpec, infos: list[ParamInfo], settings: NetFileSettings | None, solver_cfg: SolverConfig,
                     solver_file: Path) -> tuple[list[float], list[float]]:
    """Each blob's lr_mult and decay_mult, as Caffe's Net::AppendParam takes them: the layer's `param { }` blocks
    in blob order (a blob without one: 1 and 1; BatchNorm's statistics: lr_mult 0, as Caffe's BatchNormLayer
    sets it), then the solver's own `lr_mult`/`decay_mult` tables by layer, which win; a built-in net has 1 and
    1 unless the solver's tables say otherwise."""
    names = caffe_names(spec) if settings else {}
    lrs, decays = [], []
    for info in infos:
        spec_ = ParamSpec()
        if settings is not None:
            given = settings.params.get(names[info.layer], ())
            spec_ = given[info.index] if info.index < len(given) else ParamSpec()
            if info.blob in ("mean", "variance", "factor"):
                if info.index < len(given) and spec_.lr_mult != 0:
                    raise FirescaleError(f"{spec.source}: layer {names[info.layer]!r} (BatchNorm) gives its blob "
                                         f"{info.index} lr_mult {spec_.lr_mult}; Caffe refuses to learn batch "
                                         f"normalisation statistics (expected lr_mult 0, or no param block)")
                spec_ = ParamSpec(0.0, spec_.decay_mult)
        lrs.append(_table(solver_cfg.lr_mult, info, spec_.lr_mult))
        decays.append(_table(solver_cfg.decay_mult, info, spec_.decay_mult))
    for key, table in (("lr_mult", solver_cfg.lr_mult), ("decay_mult", solver_cfg.decay_mult)):
        unknown = sorted(set(table) - {i.layer for i in infos})
        if unknown:
            raise FirescaleError(f"{solver_file}: solver key '{key}.{unknown[0]}' names no layer with "
                                 f"parameters in net {spec.name!r}")
    return lrs, decays


def _table(table: dict[str, list[float]], info: ParamInfo, default: float) -> float:
    values = table.get(info.layer)
    if values is None:
        return default
    return values[info.index] if info.index < len(values) else default
