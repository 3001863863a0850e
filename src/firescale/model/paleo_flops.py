"""Paleo's own per-layer FLOP and memory counts, as its FLOP profiler makes them with GEMM convolutions."""
from __future__ import annotations

from dataclasses import replace

from firescale.model.layers import BYTES_PER_FLOAT, LayerCost, NetCost, net_cost
from firescale.nets.spec import FC, Conv, Dropout, LayerShape, NetSpec, Pool, infer_shapes

# What Paleo counts differently from model/layers.py (paleo/profilers/flops_profiler.py, paleo/layers/conv.py):
# - a convolution reads its input with the zero padding around it;
# - the input gradient of a convolution is a dense convolution over the output gradient, dilated by the
#   stride and zero-padded to the input's size plus the kernel's: 2·R·S·K·C·H·W·N FLOPs over the input's
#   H·W (for a 5x5 convolution onto a 1x1 output that is 25 times the forward pass), plus 2 FLOPs per
#   gradient element to place it when the stride leaves holes;
# - pooling costs 2 FLOPs per window element, backward as forward;
# - a fully-connected layer always computes its input gradient;
# - activations, bias additions, LRN, concatenation and the softmax cost nothing.
# Paleo's NiN/FireCaffe case has no BatchNorm, Scale, Sigmoid, TanH, Flatten or Eltwise layers; they are
# counted here as Paleo counts the activations: nothing (model/layers.py counts them).
# Paleo also applies no percent of peak to the weight update (compute_times in model/paleo.py).


def _gradient_padding(size: int, kernel: int, out: int, stride: int, pad: int) -> tuple[int, int]:
    """Along one axis: the output gradient's length once dilated by the stride, and the zero padding on
    each side that Paleo gives it to convolve back to the input (after TensorFlow's Conv2DBackpropInput)."""
    expanded = (out - 1) * stride + 1
    before = kernel - 1 - pad
    after = size + kernel - 1 - expanded - before
    if abs(before - after) == 1:
        expanded += 1
    return expanded, min(before, after)


def _conv(rec: LayerShape, conv: Conv, n: int, input_gradient: bool) -> tuple[float, float, float, float, float]:
    """A convolution's counts as Paleo's GEMM estimate makes them, forward and for both gradients."""
    h, w, c_in = rec.input_shape
    p, q, k = rec.output_shape
    c = c_in // conv.groups
    (rh, rw), (eh, ew), (sh, sw), (pad_h, pad_w) = conv.kernel_hw, conv.extent_hw, conv.stride_hw, conv.pad_hw
    weights = rh * rw * c * k
    macs = rh * rw * c * p * q * k * n
    forward_bytes = n * (h + 2 * pad_h) * (w + 2 * pad_w) * c_in + weights + n * p * q * k
    gh, ph = _gradient_padding(h, eh, p, sh, pad_h)
    gw, pw = _gradient_padding(w, ew, q, sw, pad_w)
    # dL/dW convolves the input (padded as the gradient is, none when the layer has none) with dL/dY.
    fh, fw = (ph, pw) if pad_h or pad_w else (0, 0)
    weight_bytes = n * (h + 2 * fh) * (w + 2 * fw) * c_in + n * p * q * k + weights
    data_flops, data_bytes = 0.0, 0.0
    if input_gradient:
        data_flops = 2.0 * rh * rw * k * c * h * w * n + (2.0 * n * p * q * k if gh * gw > p * q else 0.0)
        data_bytes = n * (gh + 2 * ph) * (gw + 2 * pw) * k + weights + n * h * w * c_in
    return (2.0 * macs, data_flops, 2.0 * macs, forward_bytes * BYTES_PER_FLOAT,
            (weight_bytes + data_bytes) * BYTES_PER_FLOAT)


def _counts(rec: LayerShape, n: int, input_gradient: bool) -> tuple[float, float, float, float, float]:
    """(forward FLOPs, input-gradient FLOPs, weight-gradient FLOPs, forward bytes, backward bytes)."""
    layer = rec.layer
    h, w, c = rec.input_shape
    x = h * w * c
    y = rec.output_shape[0] * rec.output_shape[1] * rec.output_shape[2]
    if isinstance(layer, Conv):
        return _conv(rec, layer, n, input_gradient)
    if isinstance(layer, FC):
        weights = x * layer.out
        flops = 2.0 * n * weights
        nbytes = float((n * x + weights + n * y) * BYTES_PER_FLOAT)
        return flops, flops, flops, nbytes, 2 * nbytes
    if isinstance(layer, Pool):
        window = h * w if layer.global_pool else layer.kernel ** 2
        flops = 2.0 * window * y * n
        nbytes = float((x + y) * n * BYTES_PER_FLOAT)
        return flops, flops, 0.0, nbytes, nbytes
    if isinstance(layer, Dropout):
        nbytes = float(2 * x * n * BYTES_PER_FLOAT)
        return float(x * n), float(x * n), 0.0, nbytes, nbytes
    return 0.0, 0.0, 0.0, 0.0, 0.0          # ReLU, LRN, Softmax, the merge of branches, and the kinds above


def paleo_net_cost(spec: NetSpec, batch: int) -> NetCost:
    """Per-layer costs of `spec` for `batch` images as Paleo counts them (the layers and shapes of net_cost)."""
    base = net_cost(spec, batch)
    layers: list[LayerCost] = []
    for rec, cost in zip(infer_shapes(spec), base.layers):
        # Paleo skips the input gradient of a convolution that reads the data, as net_cost does.
        input_gradient = not isinstance(rec.layer, Conv) or cost.backward_data_flops > 0
        fwd, data, weight, fwd_bytes, bwd_bytes = _counts(rec, batch, input_gradient)
        layers.append(replace(cost, forward_flops=fwd, backward_data_flops=data, backward_weight_flops=weight,
                              forward_memory_bytes=fwd_bytes, backward_memory_bytes=bwd_bytes, bias_flops=0.0))
    return replace(base, layers=tuple(layers), accounting="paleo")
