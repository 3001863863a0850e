"""PyTorch modules built from firescale.nets.spec with Caffe's layer semantics, its fillers and its NCHW layouts."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    Flatten,
    Layer,
    NetSpec,
    Pool,
    ReLU,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
    pool_extra_padding,
    pool_output_size,
)
from firescale.train.caffe_weights import BlobLayout, caffe_layouts, from_caffe, to_caffe
from firescale.train.params import MOVING_AVERAGE_FRACTION, STATISTICS, ParamInfo, initial_blobs

SUPPORTED = (Conv, Pool, LRN, ReLU, Sigmoid, TanH, Dropout, FC, BatchNorm, Scale, Flatten, Branches, Softmax)


class CaffeNet(torch.nn.Module):
    """A NetSpec as a torch module: NCHW inputs, logits out; Caffe's pooling sizes, LRN (across and within
    channels), grouped and dilated convolution, dropout, BatchNorm (its statistics are blobs, as in Caffe),
    Scale, and concatenated or elementwise merges.

    The blobs are Caffe's own layouts (OIHW kernels, InnerProduct weights (out, in) over C, H, W), which are
    torch's; `infos` gives their shapes in the trainer's layout, which `read_params`, `write_params` and the
    module's `to_trainer_layout` / `from_trainer_layout` convert to and from.  `params` holds every blob Caffe
    keeps: the learnt ones as parameters, BatchNorm's mean, variance and factor as buffers, which the forward
    pass of training updates in place as Caffe's BatchNormLayer::Forward_cpu does.
    """

    def __init__(self, spec: NetSpec, seed: int, moving_average: Mapping[str, float] | None = None,
                 device: str | torch.device = "cpu") -> None:
        super().__init__()
        check_supported(spec)
        self.spec = spec
        self.moving_average = dict(moving_average or {})
        self.infos: list[ParamInfo] = []
        self.layouts = blob_layouts(spec)
        self._keys: list[str] = []          # each blob's attribute name, in Caffe's order
        self._index: dict[str, int] = {}
        self._divisors: dict[tuple[str, int, int, torch.device], torch.Tensor] = {}
        for _top, info, value in initial_blobs(spec, seed):
            self._add(info, torch.from_numpy(to_caffe(self.layouts[info.name], value)).to(device))

    # ------------------------------------------------------------ blobs
    def _add(self, info: ParamInfo, value: torch.Tensor) -> None:
        """Register a blob (`blob_layouts` has refused two layers of one name already)."""
        key = info.name.replace(".", "_")
        if key in self._keys:
            key = f"{key}#{len(self._keys)}"
        if info.blob in STATISTICS:
            self.register_buffer(key, value)
        else:
            self.register_parameter(key, torch.nn.Parameter(value))
        self._index[info.name] = len(self.infos)
        self._keys.append(key)
        self.infos.append(info)

    @property
    def params(self) -> list[torch.Tensor]:
        """Every blob in Caffe's order (as `infos`), in Caffe's layout; read afresh, so that `.to()` is followed."""
        return [getattr(self, key) for key in self._keys]

    def param(self, name: str) -> torch.Tensor:
        return getattr(self, self._keys[self._index[name]])

    @property
    def learnt(self) -> list[bool]:
        """Per blob: whether it is learnt (not one of BatchNorm's statistics, which training keeps itself)."""
        return [info.blob not in STATISTICS for info in self.infos]

    @property
    def statistics(self) -> list[torch.Tensor]:
        """BatchNorm's blobs (mean, variance, factor): kept by the forward pass of training, not learnt."""
        return [p for p, learnt in zip(self.params, self.learnt) if not learnt]

    def read_params(self) -> dict[str, np.ndarray]:
        """Every blob as a float32 NumPy array in the trainer's layout (HWIO kernels, FC (in, out) over H, W, C)."""
        return {info.name: to_trainer_layout(self, info.name, p.detach().cpu().numpy())
                for info, p in zip(self.infos, self.params)}

    @torch.no_grad()
    def write_params(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Set the blobs named in `arrays` (the trainer's layout) and keep the others; a name the net lacks or an
        array of another shape is refused, naming the blob."""
        for name, array in arrays.items():
            if name not in self._index:
                raise FirescaleError(f"net {self.spec.name!r} has no blob {name!r}; expected one of its "
                                     f"{len(self.infos)} blobs, named layer/blob as {self.infos[0].name!r}")
            self.param(name).copy_(torch.from_numpy(from_trainer_layout(self, name, array)))

    # ------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, training: bool = False,
                dropout_generator: torch.Generator | None = None) -> torch.Tensor:
        """Logits (N, classes) of a float32 NCHW batch in the phase `training` says (Module.train() is not read);
        dropout (training only) draws its masks from `dropout_generator`."""
        x = self._forward(self.spec.layers, x, "", training, dropout_generator)
        return x.reshape(x.shape[0], -1)

    def _forward(self, layers: tuple[Layer, ...], x: torch.Tensor, prefix: str, training: bool,
                 generator: torch.Generator | None) -> torch.Tensor:
        for layer in layers:
            if isinstance(layer, Softmax):
                break
            x = self._layer(layer, prefix + layer.name, x, training, generator)
        return x

    def _layer(self, layer: Layer, name: str, x: torch.Tensor, training: bool,
               generator: torch.Generator | None) -> torch.Tensor:
        if isinstance(layer, Conv):
            (sh, sw), (ph, pw) = layer.stride_hw, layer.pad_hw
            bias = self.param(name + "/bias") if layer.bias else None
            return F.conv2d(x, self.param(name + "/weights"), bias, (sh, sw), (ph, pw), layer.dilation, layer.groups)
        if isinstance(layer, FC):
            bias = self.param(name + "/bias") if layer.bias else None
            y = F.linear(x.reshape(x.shape[0], -1), self.param(name + "/weights"), bias)
            return y.reshape(y.shape[0], layer.out, 1, 1)
        if isinstance(layer, Pool):
            return self._pool(layer, name, x)
        if isinstance(layer, ReLU):
            return F.relu(x)
        if isinstance(layer, Sigmoid):
            return torch.sigmoid(x)
        if isinstance(layer, TanH):
            return torch.tanh(x)
        if isinstance(layer, Flatten):  # NCHW flattens in Caffe's order: C, H, W
            return x.reshape(x.shape[0], -1, 1, 1)
        if isinstance(layer, LRN):
            return _lrn(layer, x)
        if isinstance(layer, BatchNorm):
            return self._batch_norm(layer, name, x, training)
        if isinstance(layer, Scale):
            x = x * self.param(name + "/scale")[:, None, None]
            return x + self.param(name + "/bias")[:, None, None] if layer.bias else x
        if isinstance(layer, Dropout):
            return _dropout(layer, name, x, training, generator)
        if isinstance(layer, Branches):
            return self._branches(layer, name, x, training, generator)
        raise FirescaleError(_unsupported(self.spec, name, layer))

    def _branches(self, layer: Branches, name: str, x: torch.Tensor, training: bool,
                  generator: torch.Generator | None) -> torch.Tensor:
        outs = [self._forward(branch, x, name + "/", training, generator) if branch else x
                for branch in layer.branches]
        if layer.merge == "concat":
            return torch.cat(outs, dim=1)
        y = outs[0]
        for other in outs[1:]:  # Caffe's Eltwise takes its bottoms in order
            if layer.merge == "sum":
                y = y + other
            elif layer.merge == "prod":
                y = y * other
            else:  # a tie of MAX goes to the first bottom, as Caffe's mask (torch.maximum would split it)
                y = torch.where(y >= other, y, other)
        return y

    def _pool(self, layer: Pool, name: str, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[2]), int(x.shape[3])
        if layer.global_pool:
            return x.amax(dim=(2, 3), keepdim=True) if layer.mode == "max" else x.mean(dim=(2, 3), keepdim=True)
        p, k, s = layer.pad, layer.kernel, layer.stride
        eh, ew = pool_extra_padding(h, layer), pool_extra_padding(w, layer)
        if layer.mode == "max":  # Caffe takes the max over the part of the window inside the image
            if p or eh or ew:
                x = F.pad(x, (p, p + ew, p, p + eh), value=float("-inf"))
            return F.max_pool2d(x, k, s)
        # Caffe's average divides by the window clipped to the padded image (padding counts, overhang does not).
        if p or eh or ew:
            x = F.pad(x, (p, p + ew, p, p + eh))
        return F.avg_pool2d(x, k, s, divisor_override=1) / self._divisor(layer, name, h, w, x.device)

    def _divisor(self, layer: Pool, name: str, h: int, w: int, device: torch.device) -> torch.Tensor:
        key = (name, h, w, device)
        if key not in self._divisors:
            p, k, s = layer.pad, layer.kernel, layer.stride
            rows = [min(i * s - p + k, h + p) - (i * s - p) for i in range(pool_output_size(h, layer))]
            cols = [min(j * s - p + k, w + p) - (j * s - p) for j in range(pool_output_size(w, layer))]
            self._divisors[key] = torch.tensor(np.outer(rows, cols), dtype=torch.float32, device=device)
        return self._divisors[key]

    def _batch_norm(self, layer: BatchNorm, name: str, x: torch.Tensor, training: bool) -> torch.Tensor:
        """Caffe's BatchNorm: batch statistics unless use_global_stats (default: in the TEST phase only); in
        training the stored sums decay by moving_average_fraction and gain the batch's mean and unbiased
        variance, the factor blob counting the updates; the stored statistics are the sums / factor."""
        mean_blob, var_blob = self.param(name + "/mean"), self.param(name + "/variance")
        factor = self.param(name + "/factor")
        global_stats = (not training) if layer.use_global_stats is None else layer.use_global_stats
        if global_stats:
            stored = factor[0]
            scale = torch.where(stored == 0.0, 0.0, 1.0 / torch.where(stored == 0.0, 1.0, stored))
            mean, var = mean_blob * scale, var_blob * scale
        else:
            mean = x.mean(dim=(0, 2, 3))
            var = (x - mean[:, None, None]).square().mean(dim=(0, 2, 3))
            if training:
                _update_statistics(x, mean, var, (mean_blob, var_blob, factor),
                                   self.moving_average.get(name, MOVING_AVERAGE_FRACTION))
        return (x - mean[:, None, None]) / torch.sqrt(var[:, None, None] + layer.eps)


@torch.no_grad()
def _update_statistics(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                       blobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], fraction: float) -> None:
    """Caffe's moving sums, in float32 as TensorFlow's builder: factor = factor * f + 1, mean = batch mean +
    f * mean, variance = m / (m - 1) * batch variance + f * variance (m values per channel)."""
    mean_blob, var_blob, factor = blobs
    m = np.float32(x.numel() // x.shape[1])
    correction = float(m / max(m - np.float32(1.0), np.float32(1.0))) if m > 1.0 else 1.0
    factor.mul_(fraction).add_(1.0)      # a Python float acts as its float32 on a float32 tensor
    mean_blob.mul_(fraction).add_(mean.detach().to(mean_blob.dtype))
    var_blob.mul_(fraction).add_((var.detach() * correction).to(var_blob.dtype))


def _lrn(layer: LRN, x: torch.Tensor) -> torch.Tensor:
    if layer.within_channel:
        # Caffe's WITHIN_CHANNEL: x (1 + alpha * mean of x^2 over a local_size square, zero-padded)^-beta
        p = (layer.local_size - 1) // 2
        mean = F.avg_pool2d(F.pad(x.square(), (p, p, p, p)), layer.local_size, 1)
        return x * torch.pow(1.0 + layer.alpha * mean, -layer.beta)
    # ACROSS_CHANNELS: x / (k + alpha / n * sum of x^2 over n channels centred on it)^beta
    return F.local_response_norm(x, layer.local_size, layer.alpha, layer.beta, layer.k)


def _dropout(layer: Dropout, name: str, x: torch.Tensor, training: bool,
             generator: torch.Generator | None) -> torch.Tensor:
    if not (training and layer.rate > 0):
        return x
    if generator is None:
        raise ValueError(f"layer {name!r}: dropout in training needs a dropout_generator")
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= layer.rate
    return torch.where(keep, x * (1.0 / (1.0 - layer.rate)), torch.zeros_like(x))


# ------------------------------------------------------------ layouts
def blob_layouts(spec: NetSpec) -> dict[str, BlobLayout]:
    """Every blob's trainer and Caffe layouts by its trainer name.  The layouts do not depend on Caffe's names,
    so they are taken as for a net without a source file (which `caffe_layouts` would read once per layer)."""
    return {b.param: b for blobs in caffe_layouts(replace(spec, source="")).values() for b in blobs}


def to_trainer_layout(net: CaffeNet, name: str, array: np.ndarray) -> np.ndarray:
    """The blob `name` of `net` (or an array shaped like it: a history blob) from torch's layout in the trainer's."""
    return from_caffe(net.layouts[name], np.asarray(array, np.float32))


def from_trainer_layout(net: CaffeNet, name: str, array: np.ndarray) -> np.ndarray:
    """An array of the trainer's layout for the blob `name` of `net` in torch's (Caffe's) layout; another shape
    than the blob's is refused, naming it."""
    layout = net.layouts[name]
    array = np.asarray(array, np.float32)
    if tuple(array.shape) != layout.trainer_shape:
        raise FirescaleError(f"net {net.spec.name!r} blob {name!r}: an array of shape {tuple(array.shape)} was "
                             f"given, but the blob's shape (the trainer's layout) is {layout.trainer_shape}")
    return to_caffe(layout, array)


# ------------------------------------------------------------ what the builder takes
def check_supported(spec: NetSpec) -> None:
    """Refuse, in one sentence naming the layer, a layer of a kind this builder has no forward pass for."""
    def walk(layers: tuple[Layer, ...], prefix: str) -> None:
        for layer in layers:
            if not isinstance(layer, SUPPORTED):
                raise FirescaleError(_unsupported(spec, prefix + str(getattr(layer, "name", "?")), layer))
            if isinstance(layer, Branches):
                for branch in layer.branches:
                    walk(branch, prefix + layer.name + "/")
    walk(spec.layers, "")


def _unsupported(spec: NetSpec, name: str, layer: object) -> str:
    kinds = ", ".join(kind.__name__ for kind in SUPPORTED)
    return (f"net {spec.name!r} layer {name!r} is a {type(layer).__name__}, which the PyTorch backend cannot "
            f"build; it builds {kinds}")


def build_net(spec: NetSpec, seed: int, moving_average: Mapping[str, float] | None = None,
              device: str | torch.device = "cpu") -> CaffeNet:
    """The torch model of `spec` with weights drawn from Caffe's fillers by a NumPy generator seeded `seed` (the
    TensorFlow backend's numbers); `moving_average` gives a BatchNorm layer's moving_average_fraction by name."""
    return CaffeNet(spec, seed, moving_average, device)
