"""Per-layer accounting of a NetSpec: forward and backward FLOPs, weights |W| and activations |D|."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from firescale.nets.spec import (
    FC,
    LRN,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    Flatten,
    Layer,
    LayerShape,
    NetSpec,
    Pool,
    ReLU,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
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
    blobs: tuple[int, ...] = ()  # element counts of its learnable blobs (weights, then bias), `params` in all
    state: int = 0               # stored values it does not learn (BatchNorm's mean, variance and factor)
    # The layers whose speed a device shares (a profile's efficiency fits, model/profile.py): the kind, and for a
    # convolution its kernel and stride ('conv3x3s1', 'conv1x1s1', 'conv11x11s4'), 'g' after a grouped one
    family: str = ""

    @property
    def signature(self) -> tuple[object, ...]:
        """What fixes this layer's time on a device: its family, batch, input and output shapes and parameters."""
        return (self.family or self.kind, self.batch, self.input_shape, self.output_shape, self.params)

    @property
    def elementwise(self) -> bool:
        """An activation layer, which frameworks often fuse into the layer before (Paleo leaves it out)."""
        return self.kind in ("relu", "sigmoid", "tanh")

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
    def state(self) -> int:
        """Stored values that are not learnt (BatchNorm's statistics): in a .caffemodel, not in |W|."""
        return sum(layer.state for layer in self.layers)

    @property
    def gradient_tensors(self) -> tuple[int, ...]:
        """Element counts of the gradients a rank sums, one tensor per weight and per bias blob, in the
        order the layers run: what the trainer passes to its grouped allreduce (|W| in all)."""
        return tuple(count for layer in self.layers for count in layer.blobs)

    @property
    def activation_bytes(self) -> int:
        """|D|: activations written by the convolution, pooling, LRN, concat, eltwise and fully-connected layers.

        Layers Caffe's nets run in place (ReLU, dropout, and BatchNorm, Scale, Sigmoid, TanH), Flatten (a view
        of its input) and the loss write no new blob in Caffe and are not counted.
        """
        return sum(layer.activation_bytes for layer in self.layers
                   if layer.kind in ("conv", "fc", "pool", "lrn", "concat", "eltwise"))

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
    params, fwd, bwd_data, bwd_weight, state = 0, 0.0, 0.0, 0.0, 0
    blobs: tuple[int, ...] = ()
    kind = type(layer).__name__.lower()
    if isinstance(layer, Conv):
        kind = "conv"
        c_in = rec.input_shape[2] // layer.groups
        kh, kw = layer.kernel_hw
        weights = layer.out * c_in * kh * kw
        blobs = (weights, layer.out) if layer.bias else (weights,)
        p, q, k = rec.output_shape
        macs = k * c_in * kh * kw * p * q * n
        bias_add = n * y if layer.bias else 0
        fwd = 2.0 * macs + bias_add                   # 2·K·C·R·S·N·P·Q, plus the bias add
        bwd_weight = 2.0 * macs + bias_add            # dL/dW: same GEMM size; dL/db: a sum over N·P·Q
        bwd_data = 0.0 if first_trainable else 2.0 * macs
        w_bytes = weights * BYTES_PER_FLOAT
    elif isinstance(layer, FC):
        kind = "fc"
        weights = x * layer.out
        blobs = (weights, layer.out) if layer.bias else (weights,)
        bias_add = n * layer.out if layer.bias else 0
        fwd = 2.0 * n * weights + bias_add
        bwd_weight = 2.0 * n * weights + bias_add
        bwd_data = 0.0 if first_trainable else 2.0 * n * weights
        w_bytes = weights * BYTES_PER_FLOAT
    elif isinstance(layer, Scale):
        channels = rec.output_shape[2]
        blobs = (channels, channels) if layer.bias else (channels,)
        fwd = float((2 if layer.bias else 1) * y * n)          # multiply (and add) per element
        bwd_weight = float((3 if layer.bias else 2) * y * n)   # dL/dgamma: a product and a sum; dL/dbeta: a sum
        bwd_data = float(y * n)                                # dL/dx = gamma · dL/dy
        w_bytes = channels * BYTES_PER_FLOAT
    else:
        w_bytes = 0
        if isinstance(layer, Pool):
            window = (rec.input_shape[0] * rec.input_shape[1]) if layer.global_pool else layer.kernel ** 2
            fwd = float(window * y * n)               # one compare or add per window element
            bwd_data = fwd
        elif isinstance(layer, LRN):
            window = layer.local_size ** 2 if layer.within_channel else layer.local_size
            fwd = float((2 * window + 4) * y * n)     # window sum of squares, scale, power, divide
            bwd_data = 2.0 * fwd
        elif isinstance(layer, (ReLU, Dropout)):
            fwd = float(y * n)
            bwd_data = float(y * n)
        elif isinstance(layer, (Sigmoid, TanH)):
            fwd = 4.0 * y * n                         # exp, add, divide (tanh: two exps, a quotient)
            bwd_data = 3.0 * y * n                    # dy · y(1 - y), dy · (1 - y²)
        elif isinstance(layer, BatchNorm):
            kind, state = "batchnorm", 2 * rec.output_shape[2] + 1
            fwd = 4.0 * y * n                         # mean, variance, subtract, divide
            bwd_data = 6.0 * y * n                    # two sums over the batch, then the normalised gradient
        elif isinstance(layer, Flatten):
            fwd = 0.0                                 # a view of its input
        elif isinstance(layer, Softmax):
            fwd = 4.0 * y * n                         # max, exp, sum, divide (+ log-likelihood)
            bwd_data = float(y * n)
        elif isinstance(layer, Branches):             # its branches are counted as their own layers
            kind = "concat" if layer.merge == "concat" else "eltwise"
            inputs = len(layer.branches)
            fwd = 0.0 if layer.merge == "concat" else float((inputs - 1) * y * n)
            if layer.merge == "prod":
                bwd_data = float(inputs * (inputs - 1) * y * n)   # each input's gradient: dy times the others
            elif layer.merge == "max":
                bwd_data = float(inputs * y * n)      # dy routed to the input that gave the max
    io = (x + y) * n * BYTES_PER_FLOAT
    fwd_mem = float(io + w_bytes)
    bwd_mem = 0.0
    if bwd_data:
        bwd_mem += io + w_bytes                       # read dY and W, write dX
    if bwd_weight:
        bwd_mem += io + w_bytes                       # read X and dY, write dW
    params = sum(blobs)
    bias = float(n * y) if len(blobs) == 2 else 0.0
    return LayerCost(rec.name, kind, rec.input_shape, rec.output_shape, n, params, fwd,
                     bwd_data, bwd_weight, fwd_mem, bwd_mem, bias, blobs, state, _family(layer, kind))


def _family(layer: Layer, kind: str) -> str:
    if not isinstance(layer, Conv):
        return kind
    (kh, kw), stride = layer.kernel_hw, layer.stride
    return f"conv{kh}x{kw}s{stride}" + ("g" if layer.groups > 1 else "")


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
        if isinstance(layer, Branches):
            return False
    return False


def branch_bounds(spec: NetSpec, per_layer: Sequence[float]) -> tuple[float, float]:
    """Paleo's bounds (its 3.1.2) on a quantity of `spec`'s layers, given per layer in net_cost's order.

    A `Branches` block is Paleo's supernode, its branches the subgraphs between two synchronisation
    barriers.  The lower bound runs them concurrently, so a block costs its largest branch (counted the
    same way, recursively) and then its merge; the upper runs them in series, the sum of every layer.
    """
    values = iter(per_layer)
    expected = len(infer_shapes(spec))
    if len(per_layer) != expected:
        raise ValueError(f"net {spec.name!r} has {expected} layers counting each branch's, not {len(per_layer)}")
    return _concurrent(spec.layers, values), float(sum(per_layer))


def _concurrent(layers: Sequence[Layer], values: Iterator[float]) -> float:
    total = 0.0
    for layer in layers:
        if isinstance(layer, Branches):
            branches = [_concurrent(branch, values) for branch in layer.branches]   # in infer_shapes' order
            total += max(branches)
        total += next(values)     # the layer itself; a block's own entry is its merge
    return total
