"""What a Caffe net file's data layers say about a run: the batch per rank, the transform, the test batch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from firescale.caffe.net import DATA_TYPES, CaffeLayer, DataParam, read_net
from firescale.data.transforms import Transform
from firescale.errors import FirescaleError

DEFAULT_BATCH_PER_RANK = 64    # a built-in net, or a net file whose TRAIN phase has no batch_size
DEFAULT_SCALE = 1 / 255        # a built-in net, or a net file without a TRAIN data layer (Caffe's default is 1)


@dataclass(frozen=True)
class DataLayers:
    """The first data layer of the trained file's TRAIN phase and of the test net (the solver's test_net, else the
    file's TEST phase), with the files they are in; None where there is none (a built-in net, a deploy file)."""

    train: CaffeLayer | None = None
    test: CaffeLayer | None = None
    source: str = ""
    test_source: str = ""

    def where(self, layer: CaffeLayer, key: str) -> str:
        """`FILE: the PHASE data layer 'NAME' KEY`, naming the file and key in a sentence."""
        phase, source = ("TRAIN", self.source) if layer is self.train else ("TEST", self.test_source)
        return f"{source}: the {phase} data layer {layer.name!r} {key}"


def read_data_layers(net: str, test_net: Path | None = None) -> DataLayers:
    """The data layers of `net` (a net file, or a built-in name: Caffe's shipped files have them, the nets written
    in Python none) and of the solver's `test_net`, if any."""
    from firescale.nets.zoo import get_net, is_net_file

    source = net if is_net_file(net) else get_net(net).source
    test_source = str(test_net) if test_net is not None else source
    train = _data_layer(source, "TRAIN") if source else None
    test = _data_layer(test_source, "TEST") if test_source else None
    return DataLayers(train, test, source, test_source)


def train_crop(net: str) -> int:
    """The crop a run of `net` takes without --crop: its TRAIN data layer's crop_size, 0 for none (a built-in net
    written in Python, a deploy file, a layer without one)."""
    param = data_param(read_data_layers(net).train)
    return param.crop_size if param is not None else 0


def _data_layer(source: str, phase: str) -> CaffeLayer | None:
    return next((layer for layer in read_net(source, phase).layers
                 if layer.type in DATA_TYPES and layer.type != "Input"), None)


def data_param(layer: CaffeLayer | None) -> DataParam | None:
    """A data layer's source, batch and transform_param (None without a data layer)."""
    return layer.settings if layer is not None and isinstance(layer.settings, DataParam) else None


def first_batch(layers: DataLayers, batch_per_rank: int | None, total_batch: int | None,
                ranks: int) -> tuple[int | None, int | None, str]:
    """The run's starting batch as (per rank, total), one of them given, and one line on where it comes from, or
    '': the command line's, else the TRAIN data layer's batch_size as the batch per rank (Caffe's batch_size is
    per GPU: each of Caffe's solvers reads the same net file), else 64 per rank."""
    param = data_param(layers.train)
    file_batch = param.batch_size if param is not None else 0
    if batch_per_rank is None and total_batch is None:
        if not file_batch:
            return DEFAULT_BATCH_PER_RANK, None, ""
        assert layers.train is not None
        return file_batch, None, (f"{layers.where(layers.train, 'batch_size')}: {file_batch} is the batch per rank, "
                                  f"as Caffe's is per GPU")
    per_rank = batch_per_rank if batch_per_rank is not None else (total_batch or 0) / ranks
    if file_batch and per_rank != file_batch:
        assert layers.train is not None
        given = f"--batch-per-rank {batch_per_rank}" if batch_per_rank is not None else \
            f"--total-batch {total_batch} ({per_rank:g} per rank)"
        return batch_per_rank, total_batch, (f"{layers.where(layers.train, 'batch_size')}: {file_batch} (per GPU in "
                                             f"Caffe) is set aside for {given}")
    return batch_per_rank, total_batch, ""


def data_transform(layers: DataLayers, *, scale: float | None, mean: tuple[float, ...] | str | None,
                   crop: int | None, mirror: bool | None) -> tuple[Transform, list[str]]:
    """The dataset transform and one line for each command-line option that sets aside what the file says.

    With a TRAIN data layer its transform_param is the transform, as Caffe applies it (scale 1, no mean, no crop
    and no mirror unless it says otherwise; a mean_file relative to the net file's folder, else the working
    directory), and each option given on the command line wins over it.  Without one (a built-in net, a deploy
    file) the options alone, scale 1/255 by default."""
    param, layer = data_param(layers.train), layers.train
    if param is None or layer is None:
        return Transform(scale=DEFAULT_SCALE if scale is None else scale, mean=mean, crop=crop,
                         mirror=bool(mirror)), []
    notes: list[str] = []

    def set_aside(key: str, written: str, option: str) -> None:
        notes.append(f"{layers.where(layer, f'transform_param {key}')}: {written} is set aside for {option}")

    if scale is None:
        scale = param.scale
    elif scale != param.scale:
        set_aside("scale", f"{param.scale:g}", f"--scale {scale:g}")
    file_mean: tuple[float, ...] | str | None = param.mean_value or param.mean_file or None
    if mean is None and param.mean_file:
        mean = str(_mean_file(layers, layer, param.mean_file))
    elif mean is None:
        mean = file_mean
    elif mean != file_mean:
        shown = ",".join(f"{v:g}" for v in mean) if isinstance(mean, tuple) else mean
        written = ",".join(f"{v:g}" for v in param.mean_value) if param.mean_value else repr(param.mean_file)
        set_aside("mean_file" if param.mean_file else "mean_value", written if file_mean else "none",
                  f"--mean {shown}")
    if crop is None:
        crop = param.crop_size or None
    elif crop != param.crop_size:
        set_aside("crop_size", str(param.crop_size), f"--crop {crop}")
    if mirror is None:
        mirror = param.mirror
    elif mirror != param.mirror:
        set_aside("mirror", str(param.mirror).lower(), "--mirror" if mirror else "--no-mirror")
    return Transform(scale=scale, mean=mean, crop=crop, mirror=mirror), notes


def _mean_file(layers: DataLayers, layer: CaffeLayer, written: str) -> Path:
    beside, here = Path(layers.source).parent / written, Path(written)
    for path in (beside, here):
        if path.is_file():
            return path
    raise FirescaleError(f"{layers.where(layer, 'transform_param mean_file')}: {written!r} names no file ({beside} "
                         f"beside the net file, or {here} from the working directory); give the mean with --mean "
                         f"VALUES or --mean FILE")


def test_images(test_iter: int | None, layers: DataLayers, eval_batch: int, test_set: int) -> tuple[int, str]:
    """How many test images each evaluation reads, the first of the test split, and one line saying why: test_iter
    batches of the test net's batch_size (Caffe's test reads test_iter x batch_size images), or of --eval-batch
    without a TEST data layer; without test_iter, the whole test split.  More than the split holds reads it once
    (Caffe's data layer would wrap around and count images twice)."""
    if test_iter is None:
        return test_set, ""
    param = data_param(layers.test)
    if param is not None and param.batch_size and layers.test is not None:
        batch, whose = param.batch_size, f"batch_size {param.batch_size} of the TEST data layer " \
                                         f"{layers.test.name!r} in {layers.test_source}"
    else:
        batch, whose = eval_batch, f"--eval-batch {eval_batch} (no TEST data layer gives a batch_size)"
    wanted = test_iter * batch
    if wanted > test_set:
        return test_set, (f"test_iter {test_iter} x {whose} = {wanted} images, more than the {test_set} of the test "
                          f"split: each evaluation reads the split once (Caffe would wrap around)")
    return wanted, f"each evaluation reads the first {wanted} test images: test_iter {test_iter} x {whose}"


test_images.__test__ = False  # type: ignore[attr-defined]  # a function, not a pytest test, where imported
