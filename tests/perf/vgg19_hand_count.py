"""VGG-19's memory in one training iteration, counted by hand from its layers' shapes: what the memory tests
hold the model's figures to, rather than figures copied from its own output.

The shapes are configuration E of Simonyan and Zisserman (2015), Table 1: 3x3 convolutions (padding 1) in five
blocks of 2, 2, 4, 4 and 4, of 64, 128, 256, 512 and 512 channels, each block closed by a 2x2 max pool of
stride 2, then fc6 (7x7x512 -> 4096), fc7 (4096) and fc8 (1000), on 224x224x3 images.  The bytes are float32
and counted by the rules model/memory.py states (LayerMemory, device_peaks), on a GPU, with Caffe's SGD:

- held for the run: the weights and SGD's one history blob of each, 2 x 4 bytes a parameter;
- the batch: 224x224x3 floats and one int64 label an image;
- forward, kept until the layer's backward: a convolution's output and its zero-padded copy of its input; a
  pool's output (its input needs no padding at even sides; cuDNN keeps no workspace);
- backward: a convolution's input gradient and a padded copy of it (none for conv1_1, which reads the data)
  and its weights' gradient, kept until the update; a pool's input gradient;
- at a layer's backward the gradient of its output is live too (ReLU passes it through in place);
- a device after a split also holds the copy of its first layer's input.

So the peak at the backward pass of layer L on a device that holds layers first..last is
    held(first..last) + batch (device 0) + copy in + forward(first..L) + out(L) + backward(L)
    + weight gradients(after L..last).
"""
from __future__ import annotations

from dataclasses import dataclass

F = 4                                   # bytes of a float32
BLOCKS = ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4))
FCS = (("fc6", 7 * 7 * 512, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000))
IMAGE = 224 * 224 * 3


@dataclass(frozen=True)
class Layer:
    name: str
    params: int
    forward: int        # bytes a batch, kept until its backward
    backward: int       # bytes a batch: input gradient, its workspace, the weights' gradient
    out: int            # bytes of its output for the batch


def layers(batch: int) -> list[Layer]:
    """VGG-19's convolutions, pools and fully connected layers (ReLU, dropout and the loss hold nothing the
    peaks below count)."""
    out: list[Layer] = []
    side, cin = 224, 3
    for block, (cout, convs) in enumerate(BLOCKS, start=1):
        for k in range(1, convs + 1):
            params = 3 * 3 * cin * cout + cout
            y, padded = batch * side * side * cout * F, batch * (side + 2) ** 2 * cin * F
            reads_data = not out
            x_grad = 0 if reads_data else batch * side * side * cin * F + padded
            out.append(Layer(f"conv{block}_{k}", params, y + padded, x_grad + params * F, y))
            cin = cout
        x = batch * side * side * cin * F
        side //= 2
        y = batch * side * side * cin * F
        out.append(Layer(f"pool{block}", 0, y, x, y))
    for name, n_in, n_out in FCS:
        params = n_in * n_out + n_out
        out.append(Layer(name, params, batch * n_out * F, batch * n_in * F + params * F, batch * n_out * F))
    return out


def parameters() -> int:
    """143,667,240: the paper's "144M" for configuration E (Table 2)."""
    return sum(layer.params for layer in layers(1))


def peak_at_backward(batch: int, at: str, first: str = "conv1_1", last: str = "fc8") -> int:
    """Bytes in use on the device holding layers first..last when layer `at` runs its backward pass."""
    net = layers(batch)
    names = [layer.name for layer in net]
    i, j, k = names.index(first), names.index(at), names.index(last)
    mine = net[i:k + 1]
    held = sum(2 * layer.params * F for layer in mine)
    data = batch * (IMAGE * F + 8) if i == 0 else net[i - 1].out
    forward = sum(layer.forward for layer in net[i:j + 1])
    gradients_after = sum(layer.params * F for layer in net[j + 1:k + 1])
    return held + data + forward + net[j].out + net[j].backward + gradients_after
