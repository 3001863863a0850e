"""Per-layer accounting of a NetSpec: forward and backward FLOPs, weights |W| and activations |D|."""
from __future__ import annotations

from dataclasses import dataclass

from firescale.nets.spec import (
    FC,
    LRN,
    Conv,
    Dropout,
    Inception,
    LayerShape,
    NetSpec,
    Pool,
    ReLU,
    Softmax,
    infer_shapes,
)

BYTES_PER_FLOAT = 4


@dataclass(frozen=True)
class LayerCost:
    """What one layer costs for a batch: FLOPs per pass, parameters, and bytes moved through memory.

    `backward_data_flops` is the gradient with respect to the layer's input (zero for the first
    trainable layer, whose input is the data); `backward_weight_flops` the gradient with respect to
    its weights and biases.  `*_memory_bytes` is what the pass reads and writes (inputs, weights,
    outputs), Paleo's R + W terms.
    """

    name: str
    kind: str
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, int, int]
    batch: int
    params: int
    forward_flops: float
    backward_data_flops: float
    backward_weight_flops: float
    forward_memory_bytes: float
    backward_memory_bytes: float
    bias_flops: float = 0.0      # included in forward_flops and in backward_weight_flops

    @property
    def elementwise(self) -> bool:
        """An activation layer, which frameworks often fuse into the layer before (Paleo leaves it out)."""
        return self.kind == "relu"

    @property
    def weight_bytes(self) -> int:
        """|W| of this layer (weights and biases, float32): also the size of its gradient."""
        return self.params * BYTES_PER_FLOAT

    @property
    def activation_bytes(self) -> int:
        """The activations this layer writes for the whole batch (float32)."""
        h, w, c = self.output_shape
        return h * w * c * self.batch * BYTES_PER_FLOAT

    @property
    def backward_flops(self) -> float:
        return self.backward_data_flops + self.backward_weight_flops

    @property
    def trainable(self) -> bool:
        return self.params > 0


@dataclass(frozen=True)
class NetCost:
    """Totals over a network for one batch, with FireCaffe's |W| (Eq. 1) and |D| (Eq. 2).

    `accounting` says whose counts the layers hold: "firescale" (this module) or "paleo" (Paleo's own,
    model/paleo_flops.py).
    """

    net: str
    batch: int
    layers: tuple[LayerCost, ...]
    accounting: str = "firescale"

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def weight_bytes(self) -> int:
        """|W| = |grad W|: the bytes each worker contributes to the allreduce."""
        return sum(layer.weight_bytes for layer in self.layers)

    @property
    def gradient_tensors(self) -> tuple[int, ...]:
        """Element counts of the gradients a rank sums, one tensor per weight and per bias blob, in the
        order the layers run: what the trainer passes to its grouped allreduce (|W| in all)."""
        counts: list[int] = []
        for layer in self.layers:
            if layer.trainable:
                biases = layer.output_shape[2]
                counts += [layer.params - biases, biases]
        return tuple(counts)

    @property
    def activation_bytes(self) -> int:
        """|D|: activations written by the convolution, pooling, LRN, concat and fully-connected layers.

        In-place layers (ReLU, dropout) and the loss write no new blob in Caffe and are not counted.
        """
        return sum(layer.activation_bytes for layer in self.layers
                   if layer.kind in ("conv", "fc", "pool", "lrn", "concat"))

    @property
    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def backward_flops(self) -> float:
        return sum(layer.backward_flops for layer in self.layers)

    @property
    def training_flops(self) -> float:
        return self.forward_flops + self.backward_flops


def _elements(shape: tuple[int, int, int]) -> int:
    h, w, c = shape
    return h * w * c


def _cost(rec: LayerShape, batch: int, first_trainable: bool) -> LayerCost:
    layer, n = rec.layer, batch
    x, y = _elements(rec.input_shape), _elements(rec.output_shape)
    params, fwd, bwd_data, bwd_weight = 0, 0.0, 0.0, 0.0
    kind = type(layer).__name__.lower()
    if isinstance(layer, Conv):
        kind = "conv"
        c_in = rec.input_shape[2] // layer.groups
        weights = layer.out * c_in * layer.kernel * layer.kernel
        params = weights + layer.out
        p, q, k = rec.output_shape
        macs = k * c_in * layer.kernel * layer.kernel * p * q * n
        fwd = 2.0 * macs + n * y                      # 2·K·C·R·S·N·P·Q, plus the bias add
        bwd_weight = 2.0 * macs + n * y               # dL/dW: same GEMM size; dL/db: a sum over N·P·Q
        bwd_data = 0.0 if first_trainable else 2.0 * macs
        w_bytes = weights * BYTES_PER_FLOAT
    elif isinstance(layer, FC):
        kind = "fc"
        weights = x * layer.out
        params = weights + layer.out
        fwd = 2.0 * n * weights + n * layer.out
        bwd_weight = 2.0 * n * weights + n * layer.out
        bwd_data = 0.0 if first_trainable else 2.0 * n * weights
        w_bytes = weights * BYTES_PER_FLOAT
    else:
        w_bytes = 0
        if isinstance(layer, Pool):
            window = (rec.input_shape[0] * rec.input_shape[1]) if layer.global_pool else layer.kernel ** 2
            fwd = float(window * y * n)               # one compare or add per window element
            bwd_data = fwd
        elif isinstance(layer, LRN):
            fwd = float((2 * layer.local_size + 4) * y * n)   # window sum of squares, scale, power, divide
            bwd_data = 2.0 * fwd
        elif isinstance(layer, (ReLU, Dropout)):
            fwd = float(y * n)
            bwd_data = float(y * n)
        elif isinstance(layer, Softmax):
            fwd = 4.0 * y * n                         # max, exp, sum, divide (+ log-likelihood)
            bwd_data = float(y * n)
        elif isinstance(layer, Inception):
            kind = "concat"                           # its branches are counted as their own layers
            fwd = 0.0
    io = (x + y) * n * BYTES_PER_FLOAT
    fwd_mem = float(io + w_bytes)
    bwd_mem = 0.0
    if bwd_data:
        bwd_mem += io + w_bytes                       # read dY and W, write dX
    if bwd_weight:
        bwd_mem += io + w_bytes                       # read X and dY, write dW
    bias = float(n * y) if params else 0.0
    return LayerCost(rec.name, kind, rec.input_shape, rec.output_shape, n, params, fwd,
                     bwd_data, bwd_weight, fwd_mem, bwd_mem, bias)


def net_cost(spec: NetSpec, batch: int) -> NetCost:
    """Per-layer costs of `spec` for a batch of `batch` images, in the order the layers run."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    costs: list[LayerCost] = []
    seen_trainable = False
    for rec in infer_shapes(spec):
        trainable = isinstance(rec.layer, (Conv, FC))
        # Only the layers that read the data directly skip the gradient with respect to their input.
        first = trainable and (not seen_trainable) and _reads_data(spec, rec)
        costs.append(_cost(rec, batch, first))
        seen_trainable = seen_trainable or trainable
    return NetCost(spec.name, batch, tuple(costs))


def _reads_data(spec: NetSpec, rec: LayerShape) -> bool:
    for layer in spec.layers:
        if isinstance(layer, (Conv, FC)):
            return layer is rec.layer
        if isinstance(layer, (Inception,)):
            return False
    return False
