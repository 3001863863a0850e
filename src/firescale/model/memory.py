"""Per-layer device memory of one training iteration: weights, gradients, solver history, activations, workspace."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from firescale.caffe.solver import HISTORY_BLOBS, SOLVER_TYPES
from firescale.errors import FirescaleError
from firescale.model.layers import BYTES_PER_FLOAT, net_cost
from firescale.nets.spec import (
    FC,
    LRN,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    LayerShape,
    NetSpec,
    Pool,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
    infer_shapes,
    pool_extra_padding,
)

# Parameter-sized buffers the update allocates per parameter, counted from the update rules of
# train/solvers.py as TensorFlow runs them: the gradient divided by the batch, then each elementwise
# result that cannot overwrite one of its inputs (a variable's value, or a tensor still needed).
# Weight decay adds one (decay * w).  SGD: g / batch, then momentum * h (local_rate * g is in place).
UPDATE_BUFFERS = {"SGD": 2, "Nesterov": 3, "AdaGrad": 3, "RMSProp": 4, "AdaDelta": 7, "Adam": 5}
# oneDNN's max pooling on CPU keeps one byte per output element for the backward pass (cuDNN keeps none).
MAX_POOL_WORKSPACE_BYTES = {"cpu": 1, "gpu": 0}
# Layers that write over their input and pass the gradient of their output through (TensorFlow forwards
# the buffer or fuses the layer into the one before, as Caffe runs them in place).
IN_PLACE_KINDS = ("relu", "dropout")
LABEL_BYTES = 8  # one int64 label per image


@dataclass(frozen=True)
class LayerMemory:
    """Bytes one layer needs in one training iteration of a batch, as the trainer's TensorFlow graph allocates.

    Forward: `activations` (its output) and `forward_workspace` (padded copies of the input, group
    splits, the max-pool workspace, dropout's random numbers and mask), kept until its backward pass.
    Backward: `input_gradient` (the gradient of its input, none for a layer reading the data),
    `backward_workspace` (padded and per-group gradients) and `weight_gradients`.  Update:
    `update_workspace`.  `weights` and `history` (the solver's blobs) stay for the whole run.
    """

    name: str
    kind: str
    weights: int
    history: int
    activations: int
    forward_workspace: int
    input_gradient: int
    backward_workspace: int
    weight_gradients: int
    update_workspace: int
    output_bytes: int          # the output for the whole batch: what a copy to another device moves
    largest_param: int = 0     # bytes of its largest parameter blob (the update works blob by blob)

    @property
    def forward(self) -> int:
        return self.activations + self.forward_workspace

    @property
    def backward(self) -> int:
        return self.input_gradient + self.backward_workspace + self.weight_gradients

    @property
    def update(self) -> int:
        return self.update_workspace

    @property
    def resident(self) -> int:
        """Bytes held for the whole run: weights and the solver's history."""
        return self.weights + self.history

    @property
    def total(self) -> int:
        """Everything allocated for this layer in one iteration, plus what it holds."""
        return self.resident + self.forward + self.backward + self.update


@dataclass(frozen=True)
class NetMemory:
    """Per-layer memory of a net for one batch and solver, on one kind of device."""

    net: str
    batch: int
    solver_type: str
    device_kind: str
    layers: tuple[LayerMemory, ...]
    gradient_copies: int = 1   # 2 when the gradients are summed over ranks into new tensors (Horovod)
    input_bytes: int = 0       # the batch of images and labels, on the first layer's device

    def layer(self, name: str) -> LayerMemory:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def resident(self) -> int:
        return sum(layer.resident for layer in self.layers)

    @property
    def peak(self) -> int:
        """The most bytes in use at once on one device holding the whole net (see `device_peaks`)."""
        return device_peaks(self, [0] * len(self.layers))[0].bytes


def _elements(shape: tuple[int, int, int]) -> int:
    h, w, c = shape
    return h * w * c


def _padded(rec: LayerShape) -> int:
    """Elements per image of the input as the layer's kernel reads it (zero or -inf padding included)."""
    h, w, c = rec.input_shape
    layer = rec.layer
    if isinstance(layer, Conv):
        ph, pw = layer.pad_hw
        return (h + 2 * ph) * (w + 2 * pw) * c
    if isinstance(layer, Pool) and not layer.global_pool:
        eh, ew = pool_extra_padding(h, layer), pool_extra_padding(w, layer)
        return (h + 2 * layer.pad + eh) * (w + 2 * layer.pad + ew) * c
    return h * w * c


def _layer_memory(rec: LayerShape, params: int, reads_data: bool, batch: int, solver_type: str,
                  decay: bool, device_kind: str, state: int = 0, blobs: tuple[int, ...] = ()) -> LayerMemory:
    layer, n, f = rec.layer, batch, BYTES_PER_FLOAT
    x, y, xp = n * _elements(rec.input_shape) * f, n * _elements(rec.output_shape) * f, n * _padded(rec) * f
    pad = xp if xp != x else 0                 # the padded copy of the input, when there is padding
    w_bytes = params * f
    act = fws = dx = bws = 0
    kind = type(layer).__name__.lower()
    if isinstance(layer, Conv):
        kind, act, fws = "conv", y, pad
        dx, bws = (0, 0) if reads_data else (x, pad)
        if layer.groups > 1:                   # split input and kernel, one output per group, concat
            fws += xp + (w_bytes - layer.out * f) + y
            bws += y + w_bytes - layer.out * f + (0 if reads_data else xp)
    elif isinstance(layer, FC):
        kind, act, dx = "fc", y, (0 if reads_data else x)
    elif isinstance(layer, Pool):
        act = y
        if layer.global_pool:
            dx = x
        else:
            workspace = MAX_POOL_WORKSPACE_BYTES[device_kind] * y // f if layer.mode == "max" else 0
            fws, dx, bws = pad + workspace, x, pad
    elif isinstance(layer, LRN):
        act, dx = y, x
    elif isinstance(layer, Dropout):
        fws = y + y // f                       # uniform random numbers, and the mask (one byte each)
        act = y
    elif isinstance(layer, Branches):
        if layer.merge == "concat":
            kind, act, bws = "concat", y, y    # the output's gradient split per branch (summed in place)
        else:                                  # sum passes its output's gradient on; prod and max make one each
            kind, act, bws = "eltwise", y, (0 if layer.merge == "sum" else len(layer.branches) * y)
    elif isinstance(layer, (BatchNorm, Scale, Sigmoid, TanH)):
        act, dx = y, x                         # its output (kept for the backward pass) and its input's gradient
        if isinstance(layer, BatchNorm):
            kind, fws = "batchnorm", 2 * rec.output_shape[2] * f     # the batch's mean and variance
    elif isinstance(layer, Softmax):
        act = n * f if layer.loss else y       # per-image losses (their gradient reuses the logits' buffer)
    # ReLU runs in place (or fused into the layer before), Flatten is a view: nothing of their own.
    buffers = UPDATE_BUFFERS[solver_type] + (1 if decay else 0)
    return LayerMemory(rec.name, kind, weights=w_bytes + state * f, history=HISTORY_BLOBS[solver_type] * w_bytes,
                       activations=act, forward_workspace=fws, input_gradient=dx, backward_workspace=bws,
                       weight_gradients=w_bytes, update_workspace=buffers * w_bytes, output_bytes=y,
                       largest_param=max(blobs, default=0) * f)


def net_memory(spec: NetSpec, batch: int, solver_type: str = "SGD", *, weight_decay: bool = True,
               device_kind: str = "gpu", ranks: int = 1) -> NetMemory:
    """Per-layer memory of training `spec` at `batch` images per device with Caffe solver `solver_type`.

    The layers and their shapes are the performance model's (`model.layers.net_cost`); `device_kind`
    ("gpu" or "cpu") decides the max-pool workspace; with several `ranks` the summed gradients are
    a second copy of the weight gradients during the update.
    """
    if solver_type not in SOLVER_TYPES:
        raise FirescaleError(f"solver type {solver_type!r} is not one of {', '.join(SOLVER_TYPES)}")
    if device_kind not in MAX_POOL_WORKSPACE_BYTES:
        raise FirescaleError(f"device kind {device_kind!r} is not one of {', '.join(MAX_POOL_WORKSPACE_BYTES)}")
    cost = net_cost(spec, batch)
    layers = []
    for rec, lc in zip(infer_shapes(spec), cost.layers):
        reads_data = lc.trainable and lc.backward_data_flops == 0
        layers.append(_layer_memory(rec, lc.params, reads_data, batch, solver_type, weight_decay, device_kind,
                                    lc.state, lc.blobs))
    inputs = batch * (_elements(spec.input_shape) * BYTES_PER_FLOAT + LABEL_BYTES)
    return NetMemory(spec.name, batch, solver_type, device_kind, tuple(layers), 2 if ranks > 1 else 1, inputs)


# ---------------------------------------------------------------- peaks, per device


@dataclass(frozen=True)
class DevicePeak:
    """The most bytes in use on one device during an iteration, and when (layer and pass)."""

    device: int
    bytes: int
    resident: int
    at: str
    training_bytes: int = 0   # the peak of the forward and backward passes
    update_bytes: int = 0     # the peak of the update (an upper bound: a parameter's buffers all at once)


def _boundaries(devices: Sequence[int]) -> list[int]:
    """Indices i where layer i runs on another device than layer i - 1 (a copy goes in between)."""
    return [i for i in range(1, len(devices)) if devices[i] != devices[i - 1]]


def device_peaks(memory: NetMemory, devices: Sequence[int]) -> list[DevicePeak]:
    """Peak bytes per device when layer i runs on device `devices[i]`, walking one iteration in order.

    Every device holds its layers' weights and history.  In the forward pass each layer's activations and
    workspace stay until its own backward pass; a layer after a boundary also holds the copy of its
    input.  Backward goes in reverse: a layer adds its gradients, then frees its forward tensors,
    its workspace and the gradient of its output (on the other side of a boundary, a copy of it comes
    back first).  Weight gradients stay until the update, which adds a parameter's update buffers
    blob by blob (the largest one counts) beside the summed gradients.
    """
    layers = memory.layers
    if len(devices) != len(layers):
        raise FirescaleError(f"a placement of net {memory.net!r} needs one device per layer "
                             f"({len(layers)}), not {len(devices)}")
    count = max(devices) + 1
    resident = [0] * count
    for layer, d in zip(layers, devices):
        resident[d] += layer.resident
    live, peak, at = list(resident), list(resident), ["start"] * count
    live[devices[0]] += memory.input_bytes
    cut = set(_boundaries(devices))

    def add(d: int, nbytes: int, where: str) -> None:
        live[d] += nbytes
        if live[d] > peak[d]:
            peak[d], at[d] = live[d], where

    for i, (layer, d) in enumerate(zip(layers, devices)):
        if i in cut:
            add(d, layers[i - 1].output_bytes, f"copy into {layer.name} (forward)")
        add(d, layer.forward, f"{layer.name} (forward)")
    pending = 0  # the gradient of the current layer's output (in-place layers pass it through)
    for i in range(len(layers) - 1, -1, -1):
        layer, d = layers[i], devices[i]
        if i + 1 in cut:  # the gradient comes back over the boundary: a copy here, the original freed there
            live[devices[i + 1]] -= pending
            pending = layer.output_bytes
            add(d, pending, f"copy into {layer.name} (backward)")
        add(d, layer.backward, f"{layer.name} (backward)")
        live[d] -= layer.forward + layer.backward_workspace + (layers[i - 1].output_bytes if i in cut else 0)
        if layer.kind not in IN_PLACE_KINDS:
            live[d] -= pending
            pending = layer.input_gradient
    out = []
    for d in range(count):
        mine = [l for l, dev in zip(layers, devices) if dev == d]
        grads = sum(l.weight_gradients for l in mine) * memory.gradient_copies
        worst = max(mine, key=lambda l: l.largest_param * (l.update_workspace // max(l.weights, 1)), default=None)
        buffers = (worst.update_workspace // max(worst.weights, 1)) * worst.largest_param if worst else 0
        update = resident[d] + grads + buffers
        top, where = (update, f"{worst.name if worst else '-'} (update)") if update > peak[d] else (peak[d], at[d])
        out.append(DevicePeak(d, top, resident[d], where, peak[d], update))
    return out
