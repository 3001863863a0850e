"""The built-in nets as NetSpecs, looked up by name: the ones written in Python, Caffe's own files, or a path."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    XAVIER,
    ZERO,
    Conv,
    Dropout,
    Inception,
    Layer,
    NetSpec,
    Pool,
    ReLU,
    Shape,
    Softmax,
    constant,
    gaussian,
    infer_shapes,
)
from firescale.resources import caffe_zoo_file


def _lenet_same(num_classes: int) -> tuple[Layer, ...]:
    # Caffe's LeNet with "same" padding in the convolutions so that 8x8 digits fit as well as 28x28; Caffe's own
    # LeNet (no padding, 28x28 only) is `lenet`, its file in CAFFE_NETS.
    return (
        Conv("conv1", 20, 5, pad=2), Pool("pool1", "max", 2, 2),
        Conv("conv2", 50, 5, pad=2), Pool("pool2", "max", 2, 2),
        FC("ip1", 500), ReLU("relu1"), FC("ip2", num_classes), Softmax(),
    )


def _nin(num_classes: int) -> tuple[Layer, ...]:
    # NiN for ImageNet (Lin et al., Caffe model zoo); FireCaffe 7.1: std 0.01 for 1x1, 0.05 otherwise, bias 0.
    def block(i: int, conv: Conv, cccp: tuple[int, int]) -> tuple[Layer, ...]:
        a, b = cccp
        return (conv, ReLU(f"relu{i}"),
                Conv(f"cccp{2 * i - 1}", a, 1, weight_init=gaussian(0.01)), ReLU(f"relu{i}a"),
                Conv(f"cccp{2 * i}", b, 1, weight_init=gaussian(0.01)), ReLU(f"relu{i}b"))
    g = gaussian(0.05)
    return (
        *block(1, Conv("conv1", 96, 11, stride=4, weight_init=g), (96, 96)), Pool("pool1", "max", 3, 2),
        *block(2, Conv("conv2", 256, 5, pad=2, weight_init=g), (256, 256)), Pool("pool2", "max", 3, 2),
        *block(3, Conv("conv3", 384, 3, pad=1, weight_init=g), (384, 384)), Pool("pool3", "max", 3, 2),
        Dropout("drop"),
        *block(4, Conv("conv4-1024", 1024, 3, pad=1, weight_init=g), (1024, num_classes)),
        Pool("pool4", "avg", global_pool=True), Softmax(),
    )


def _alexnet(num_classes: int) -> tuple[Layer, ...]:
    # Caffe's bvlc_alexnet: gaussian 0.01 (fc6/fc7 0.005), biases 0 or 0.1, two groups in conv2/4/5.
    g, b1 = gaussian(0.01), constant(0.1)
    return (
        Conv("conv1", 96, 11, stride=4, weight_init=g), ReLU("relu1"), LRN("norm1"), Pool("pool1", "max", 3, 2),
        Conv("conv2", 256, 5, pad=2, groups=2, weight_init=g, bias_init=b1), ReLU("relu2"), LRN("norm2"),
        Pool("pool2", "max", 3, 2),
        Conv("conv3", 384, 3, pad=1, weight_init=g), ReLU("relu3"),
        Conv("conv4", 384, 3, pad=1, groups=2, weight_init=g, bias_init=b1), ReLU("relu4"),
        Conv("conv5", 256, 3, pad=1, groups=2, weight_init=g, bias_init=b1), ReLU("relu5"),
        Pool("pool5", "max", 3, 2),
        FC("fc6", 4096, gaussian(0.005), b1), ReLU("relu6"), Dropout("drop6"),
        FC("fc7", 4096, gaussian(0.005), b1), ReLU("relu7"), Dropout("drop7"),
        FC("fc8", num_classes, g), Softmax(),
    )


def _inception(name: str, c1: int, r3: int, c3: int, r5: int, c5: int, proj: int) -> Inception:
    b = constant(0.2)

    def conv(n: str, out: int, k: int) -> tuple[Layer, ...]:
        return (Conv(n, out, k, pad=k // 2, bias_init=b), ReLU(f"relu_{n}"))
    return Inception(name, (
        conv("1x1", c1, 1),
        conv("3x3_reduce", r3, 1) + conv("3x3", c3, 3),
        conv("5x5_reduce", r5, 1) + conv("5x5", c5, 5),
        (Pool("pool", "max", 3, 1, pad=1),) + conv("pool_proj", proj, 1),
    ))


def _googlenet(num_classes: int) -> tuple[Layer, ...]:
    # Inception v1 as bvlc_googlenet/train_val.prototxt, layer for layer and name for name, without the two
    # auxiliary classifiers (as the file's loader leaves them out); its fillers are FireCaffe 7.1's: xavier, bias 0.2.
    b = constant(0.2)
    return (
        Conv("conv1/7x7_s2", 64, 7, stride=2, pad=3, bias_init=b), ReLU("conv1/relu_7x7"),
        Pool("pool1/3x3_s2", "max", 3, 2), LRN("pool1/norm1"),
        Conv("conv2/3x3_reduce", 64, 1, bias_init=b), ReLU("conv2/relu_3x3_reduce"),
        Conv("conv2/3x3", 192, 3, pad=1, bias_init=b), ReLU("conv2/relu_3x3"), LRN("conv2/norm2"),
        Pool("pool2/3x3_s2", "max", 3, 2),
        _inception("inception_3a", 64, 96, 128, 16, 32, 32),
        _inception("inception_3b", 128, 128, 192, 32, 96, 64),
        Pool("pool3/3x3_s2", "max", 3, 2),
        _inception("inception_4a", 192, 96, 208, 16, 48, 64),
        _inception("inception_4b", 160, 112, 224, 24, 64, 64),
        _inception("inception_4c", 128, 128, 256, 24, 64, 64),
        _inception("inception_4d", 112, 144, 288, 32, 64, 64),
        _inception("inception_4e", 256, 160, 320, 32, 128, 128),
        Pool("pool4/3x3_s2", "max", 3, 2),
        _inception("inception_5a", 256, 160, 320, 32, 128, 128),
        _inception("inception_5b", 384, 192, 384, 48, 128, 128),
        Pool("pool5/7x7_s1", "avg", 7, 1), Dropout("pool5/drop_7x7_s1", 0.4),
        FC("loss3/classifier", num_classes, XAVIER, ZERO), Softmax("loss3/loss3"),
    )


def _vgg(num_classes: int, depths: tuple[int, ...]) -> tuple[Layer, ...]:
    # VGG (Simonyan and Zisserman): 3x3 convolutions in five stages of 64 to 512 filters; xavier weights and
    # zero biases (Caffe's usual choice for training it).
    layers: list[Layer] = []
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512, 512), depths), start=1):
        for i in range(1, count + 1):
            layers += [Conv(f"conv{stage}_{i}", width, 3, pad=1), ReLU(f"relu{stage}_{i}")]
        layers.append(Pool(f"pool{stage}", "max", 2, 2))
    layers += [FC("fc6", 4096), ReLU("relu6"), Dropout("drop6"),
               FC("fc7", 4096), ReLU("relu7"), Dropout("drop7"), FC("fc8", num_classes), Softmax()]
    return tuple(layers)


def _vgg19(num_classes: int) -> tuple[Layer, ...]:
    return _vgg(num_classes, (2, 2, 4, 4, 4))     # configuration E


def _vgg16(num_classes: int) -> tuple[Layer, ...]:
    return _vgg(num_classes, (2, 2, 3, 3, 3))     # configuration D, as the model zoo's VGG_ILSVRC_16_layers


_NETS = {
    # name: (builder, default input (H, W, C), default classes, initialisation scheme)
    "lenet_same": (_lenet_same, (28, 28, 1), 10, "xavier weights, zero biases (Caffe LeNet)"),
    "nin": (_nin, (224, 224, 3), 1000, "gaussian std 0.01 for 1x1 and 0.05 for others, zero biases "
                                       "(FireCaffe 7.1)"),
    "alexnet": (_alexnet, (227, 227, 3), 1000, "gaussian std 0.01 (fc6/fc7 0.005), biases 0 or 0.1 "
                                               "(bvlc_alexnet)"),
    "googlenet": (_googlenet, (224, 224, 3), 1000, "xavier weights, biases 0.2 (FireCaffe 7.1)"),
    "vgg19": (_vgg19, (224, 224, 3), 1000, "xavier weights, zero biases"),
    "vgg16": (_vgg16, (224, 224, 3), 1000, "xavier weights, zero biases"),
}

# Caffe's own files shipped in nets/caffe_zoo (its README gives each one's origin and licence): the name,
# the file, and the input (H, W, C) when the file's data layer does not say it.
CAFFE_NETS: dict[str, tuple[str, Shape | None]] = {
    "lenet": ("mnist/lenet_train_test.prototxt", (28, 28, 1)),
    "caffenet": ("bvlc_reference_caffenet/train_val.prototxt", None),
    "resnet50": ("resnet/ResNet-50-deploy.prototxt", None),
    "cifar10_quick": ("cifar10/cifar10_quick_train_test.prototxt", (32, 32, 3)),
    "cifar10_full": ("cifar10/cifar10_full_train_test.prototxt", (32, 32, 3)),
}

NET_NAMES: tuple[str, ...] = (*_NETS, *CAFFE_NETS)


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _named(names: Iterable[str], name: str) -> str | None:
    """The one of `names` that `name` spells (any case, '-' and '_' optional), or None."""
    return {_key(n): n for n in names}.get(_key(name))


def is_known_net(name: str) -> bool:
    """Whether `name` is one of NET_NAMES, spelt as `get_net` accepts it (any case, '-' and '_' optional)."""
    return _named(_NETS, name) is not None or _named(CAFFE_NETS, name) is not None


def is_net_file(name: str) -> bool:
    """Whether `--net NAME` names a Caffe net file (a .prototxt, or a path) rather than a built-in net."""
    return name.endswith(".prototxt") or "/" in name or "\\" in name


def get_net(name: str, num_classes: int | None = None, input_shape: Shape | None = None) -> NetSpec:
    """The named network (see NET_NAMES) or the Caffe net file at path `name` (its TRAIN phase), optionally for
    other classes or inputs; a file's input and classes default to the file's own."""
    from firescale.nets.caffe_file import load_net_file

    if is_net_file(name):
        shape = _shape(name, input_shape)
        return load_net_file(Path(name), input_shape=shape, num_classes=_classes(name, num_classes))
    file_net = _named(CAFFE_NETS, name)
    if file_net is not None:
        path, default = CAFFE_NETS[file_net]
        spec = load_net_file(caffe_zoo_file(path), input_shape=_shape(name, input_shape) or default,
                             num_classes=_classes(name, num_classes))
        return replace(spec, name=file_net)
    python_net = _named(_NETS, name)
    if python_net is None:
        raise FirescaleError(f"unknown net {name!r}; known nets: {', '.join(NET_NAMES)}, or a Caffe net file "
                             f"(path/to/train_val.prototxt)")
    builder, default_shape, default_classes, init = _NETS[python_net]
    classes = _classes(name, num_classes) or default_classes
    shape = _shape(name, input_shape) or default_shape
    spec = NetSpec(python_net, shape, classes, builder(classes), init)
    infer_shapes(spec)  # fail now, with the layer named, if the input is too small
    return spec


def _classes(name: str, num_classes: int | None) -> int | None:
    if num_classes is not None and int(num_classes) < 1:
        raise FirescaleError(f"net {name!r}: num_classes must be at least 1, not {num_classes}")
    return None if num_classes is None else int(num_classes)


def _shape(name: str, input_shape: Shape | None) -> Shape | None:
    if input_shape is None:
        return None
    shape = tuple(int(x) for x in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise FirescaleError(f"net {name!r}: input_shape must be (H, W, C), not {input_shape!r}")
    return shape
