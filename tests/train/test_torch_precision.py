"""bf16 changes the arithmetic: one iteration of the pytorch backend's steps under bf16 autocast gives other
numbers than fp32's, yet near them; on the CPU here, and on a CUDA GPU (marked gpu, skipped without one).

Tests elsewhere hold bf16 near fp32 (tests/train/test_torch_gpu.py) and bf16 training to a falling loss
(tests/train/test_backend_choice.py); both would pass if bf16 were silently trained in fp32.  Here the same
iteration from the same weights and batch is run three times, fp32, fp32 again and bf16: the two fp32 runs
agree bit for bit, so whatever bf16 changes is bf16's.  Measured on this machine's CPU on 2026-12-02 (LeNet,
16 images): the loss 0.009% from fp32's, each blob's update 0.2% (ip2's bias) to 8.7% (conv1's weights) from
fp32's in norm."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from firescale.caffe.solver import SolverConfig
from firescale.nets.zoo import get_net
from firescale.train.torch.backend import TorchBackend
from firescale.train.torch.distributed import Rank

pytestmark = pytest.mark.pytorch

RATE = 0.01
# bf16 keeps 8 bits of mantissa: its rounding (2**-8 = 0.4%) moves the loss and the gradients by far more than
# float32's (2**-24), and by far less than a wrong net would.
CHANGED = 1e-4           # an update at least this far from fp32's in norm (relative): bf16 did change the arithmetic
LOSS_NEAR, UPDATE_NEAR = 1e-2, 0.3


def one_iteration(precision: str, device: str) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The backend's grouped iteration (gradients, sum over one rank, Caffe's SGD update) from seeded weights and
    a seeded batch: (the loss, the weights before, the weights after)."""
    backend = TorchBackend(precision, "none")
    rank = Rank(0, 1, 0, 1, device, [], "none")
    backend.device = device
    backend._set_precision(rank)   # what init_rank does once it has chosen the device
    assert backend.autocast == (torch.bfloat16 if precision == "bf16" else None)
    spec = get_net("lenet", num_classes=10, input_shape=(28, 28, 1))
    net = backend.build_net(spec, 3, None, None)
    names = [i.name for i in net.infos]
    solver = backend.make_solver(SolverConfig(base_lr=RATE, momentum=0.9, weight_decay=0.0005), net, names,
                                 [1.0] * len(names), [1.0] * len(names))
    steps = backend.make_steps(net, solver, rank, spec.input_shape, overlap=False)
    rng = np.random.default_rng(5)
    images, labels = steps.batch(rng.random((16, 28, 28, 1), np.float32), rng.integers(0, 10, 16).astype(np.int64))
    before = {name: array.copy() for name, array in backend.read_params(net).items()}
    pair = steps.iteration(images, labels, (7, 0), RATE, 0, 16, 0.0)
    after = {name: array.copy() for name, array in backend.read_params(net).items()}
    assert all(a.dtype == np.float32 for a in after.values())   # weights, loss and update stay float32
    return float(steps.host(pair)[0]), before, after


def check_bf16_changes_the_arithmetic(device: str) -> None:
    loss32, start, w32 = one_iteration("fp32", device)
    again, _, w32_again = one_iteration("fp32", device)
    loss16, start16, w16 = one_iteration("bf16", device)
    assert again == loss32 and all(np.array_equal(w32[n], w32_again[n]) for n in w32)   # fp32 repeats exactly
    assert all(np.array_equal(start[n], start16[n]) for n in start)                     # from the same weights
    assert loss16 != loss32 and abs(loss16 - loss32) <= LOSS_NEAR * abs(loss32), (loss16, loss32)
    apart = {}
    for name in w32:
        step32, step16 = w32[name] - start[name], w16[name] - start[name]
        if np.linalg.norm(step32) > 0:
            apart[name] = float(np.linalg.norm(step16 - step32) / np.linalg.norm(step32))
    print(f"{device}: loss fp32 {loss32:.6f}, bf16 {loss16:.6f}; updates apart:",
          ", ".join(f"{n} {d:.3g}" for n, d in apart.items()))
    assert apart and max(apart.values()) < UPDATE_NEAR, apart
    assert min(apart.values()) > CHANGED, apart    # every learnt blob's update moved by bf16's rounding


def test_bf16_autocast_changes_a_cpu_step_and_stays_near_fp32():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one core, as a test worker's rank; and the same summation order every run
    try:
        check_bf16_changes_the_arithmetic("cpu")
    finally:
        torch.set_num_threads(threads)


@pytest.mark.gpu
def test_bf16_autocast_changes_a_gpu_step_and_stays_near_fp32():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False   # fp32 repeats exactly
    try:
        check_bf16_changes_the_arithmetic("cuda:0")
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved
