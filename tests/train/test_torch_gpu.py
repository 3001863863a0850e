"""The PyTorch backend on a CUDA GPU: NCCL with one rank, the same nets on the GPU as on the CPU, bf16 autocast,
the trainer's steps and batches on the device, and `firescale train --framework pytorch` on digits.

Skipped without a CUDA GPU (conftest.py); `firescale bench gpu` runs them on a GPU node (docs/gpu-check.md).  They
need only what such a node has: torch, h5py, scikit-learn, no lmdb (datasets are ingested as HDF5).

Tolerances.  fp32 with TF32 off: every logit, loss, gradient and BatchNorm blob on the GPU within 1e-4 of the
largest magnitude of the CPU's array (cuDNN's and the CPU's kernels sum in other orders; float32 rounding lands
near 1e-6 of it).  bf16 autocast against fp32 on the GPU: the loss within 1% (measured on a CPU's bf16 autocast:
at most 0.2%), all gradients together within 15% in norm and each blob's gradient pointing the same way (cosine
above 0.98; measured 2-6% and 0.995 or more).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from firescale.caffe.solver import SolverConfig
from firescale.nets.spec import Dropout, NetSpec
from firescale.nets.zoo import get_net
from firescale.train.torch.backend import TorchBackend
from firescale.train.torch.nets import CaffeNet
from firescale.train.torch.steps import eval_sums, loss_and_gradients

pytestmark = [pytest.mark.gpu, pytest.mark.pytorch]

REPO = Path(__file__).resolve().parents[2]
FP32_TOL = 1e-4
BF16_LOSS, BF16_NORM, BF16_COSINE = 1e-2, 0.15, 0.98
# LeNet (Caffe's own file), a residual net with BatchNorm, Scale and Eltwise SUM and PROD (a Caffe file of the
# tests), and CaffeNet (grouped convolutions, LRN across channels, overlapping pools), each at a small batch.
NETS = {"lenet": ("lenet", None, 8), "tiny_resnet": (str(REPO / "tests/caffe/net_files/tiny_resnet.prototxt"),
                                                     (8, 8, 1), 8), "caffenet": ("caffenet", None, 2)}


@pytest.fixture
def fp32_numerics():
    """TF32 off for matrix products and cuDNN's convolutions (the backend's fp32), put back afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _spec(key: str) -> NetSpec:
    name, shape, _ = NETS[key]
    spec = get_net(name, input_shape=shape)
    # Dropout draws its masks from the device's generator, which differs between CPU and GPU: no masks here.
    return replace(spec, layers=tuple(replace(layer, rate=0.0) if isinstance(layer, Dropout) else layer
                                      for layer in spec.layers))


def _batch(spec: NetSpec, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, w, c = spec.input_shape
    return torch.rand(n, c, h, w, generator=g), torch.randint(0, spec.num_classes, (n,), generator=g)


def _close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = FP32_TOL) -> None:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, what
    assert torch.isfinite(got).all(), what
    scale = float(want.abs().max()) if want.numel() else 0.0
    worst = float((got - want).abs().max()) if want.numel() else 0.0
    assert worst <= tol * scale, f"{what}: {worst:.3g} apart, {worst / scale if scale else 0:.3g} of the largest"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------ NCCL and the rank
@pytest.fixture
def nccl_group():
    """A one-rank NCCL process group made as init_rank makes it for several ranks: the backend's rendezvous (a TCP
    store on MASTER_ADDR:MASTER_PORT), then init_process_group with the rank's device."""
    from firescale.train.torch.rendezvous import Place, rendezvous

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    timeout = timedelta(seconds=120)
    store, _, _ = rendezvous(Place(0, 1, 0, 1, "none"), {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())},
                             timeout)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timeout, device_id=device)
    yield device
    dist.destroy_process_group()


def test_nccl_sums_cuda_tensors_over_one_rank(nccl_group):
    """all_reduce over NCCL of CUDA tensors (float32, bfloat16, int64; blocking and async), and the backend's grouped
    sum (one flat buffer per dtype): a sum over one rank is the tensor itself, bit for bit."""
    from firescale.train.torch.distributed import _flat_sum

    assert dist.get_backend() == "nccl"
    x = torch.randn(1000, device=nccl_group)
    want = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    assert torch.equal(x, want)
    b = torch.randn(333, device=nccl_group, dtype=torch.bfloat16)
    work = dist.all_reduce(b.clone(), op=dist.ReduceOp.SUM, async_op=True)
    work.wait()
    tensors = [torch.randn(3, 4, device=nccl_group), torch.arange(7, device=nccl_group),
               torch.randn(5, device=nccl_group), b]
    for got, sent in zip(_flat_sum(tensors), tensors):
        assert got.device == sent.device and got.dtype == sent.dtype and torch.equal(got, sent)


def test_gradient_buckets_overlap_backward_over_nccl(nccl_group):
    """GradientBuckets' hooks start each bucket's NCCL all_reduce during backward on the GPU.  The group has one
    member, so a stand-in Rank of two makes the buckets run as they would for several ranks (the sum is then the
    gradient itself)."""
    from firescale.train.torch.distributed import GradientBuckets, Rank
    from firescale.train.torch.steps import loss_backward

    spec = _spec("lenet")
    net = CaffeNet(spec, 3, device=nccl_group)
    images, labels = (t.to(nccl_group) for t in _batch(spec, 8, 0))
    _, want = loss_and_gradients(net, images, labels)
    rank = Rank(0, 2, 0, 2, str(nccl_group), [], "nccl")    # two ranks in its own eyes, one member in the group
    learnt = [p for p, keep in zip(net.params, net.learnt) if keep]
    buckets = GradientBuckets(rank, learnt, bucket_bytes=1 << 20)
    assert len(buckets.buckets) > 1
    loss_backward(net, images, labels)
    got = buckets.wait()
    buckets.remove()
    for g, w, info in zip(got, [w for w, keep in zip(want, net.learnt) if keep], net.infos):
        _close(g, w, info.name, tol=1e-6)


def test_init_rank_takes_the_gpu_and_the_precision_its_settings():
    """One rank on a GPU node: the GPU, no pinned core, no process group, cuDNN's deterministic kernels; fp32 turns
    TF32 off, tf32 on, bf16 autocasts to bfloat16."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for precision, tf32, autocast in (("tf32", True, None), ("fp32", False, None),
                                          ("bf16", False, torch.bfloat16)):
            backend = TorchBackend(precision, "nccl")
            rank = backend.init_rank(1, 1)
            assert rank.device == "cuda:0" and rank.size == 1 and rank.process_group == "none"
            assert rank.pinned_cpus == [] and torch.backends.cudnn.deterministic
            assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
            assert backend.autocast == autocast
            versions = backend.versions(rank)
            assert versions["cuda"] and versions["cudnn"] and versions["nccl"], versions
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ------------------------------------------------------------ the same nets on GPU and CPU
@pytest.mark.parametrize("key", list(NETS))
def test_net_on_the_gpu_agrees_with_the_cpu(key, fp32_numerics):
    """From one seed the same blobs on both devices; for the same images, within FP32_TOL of the CPU's largest
    value: the TEST phase's logits, the training loss, every gradient, BatchNorm's blobs after training's forward,
    and a test batch's summed loss."""
    spec = _spec(key)
    cpu, gpu = CaffeNet(spec, 5), CaffeNet(spec, 5, device="cuda")
    for a, b in zip(cpu.params, gpu.params):
        assert torch.equal(a, b.cpu())
    images, labels = _batch(spec, NETS[key][2], 1)
    with torch.no_grad():
        _close(gpu(images.cuda()), cpu(images), f"{key} logits")
    loss_cpu, grads_cpu = loss_and_gradients(cpu, images, labels)
    loss_gpu, grads_gpu = loss_and_gradients(gpu, images.cuda(), labels.cuda())
    _close(loss_gpu, loss_cpu, f"{key} loss")
    for info, g, c in zip(cpu.infos, grads_gpu, grads_cpu):
        assert g.is_cuda
        _close(g, c, f"{key} gradient of {info.name}")
    for info, g, c in zip(cpu.infos, gpu.params, cpu.params):    # BatchNorm's blobs after training's forward
        _close(g, c, f"{key} blob {info.name}")
    sums_gpu, sums_cpu = eval_sums(gpu, images.cuda(), labels.cuda()), eval_sums(cpu, images, labels)
    assert sums_gpu[3] == sums_cpu[3] and abs(sums_gpu[0] - sums_cpu[0]) <= FP32_TOL * abs(sums_cpu[0])


@pytest.mark.parametrize("key", ["lenet", "tiny_resnet"])
def test_bf16_autocast_trains_near_fp32(key, fp32_numerics):
    """bf16 autocast's forward and backward on the GPU: float32 gradients of float32 blobs, the loss within
    BF16_LOSS of fp32's, the gradients within BF16_NORM in norm and each blob's at cosine above BF16_COSINE."""
    spec = _spec(key)
    images, labels = (t.cuda() for t in _batch(spec, 16, 2))
    fp32, bf16 = CaffeNet(spec, 3, device="cuda"), CaffeNet(spec, 3, device="cuda")
    loss32, grads32 = loss_and_gradients(fp32, images, labels)
    loss16, grads16 = loss_and_gradients(bf16, images, labels, autocast_dtype=torch.bfloat16)
    assert loss16.dtype == torch.float32 and torch.isfinite(loss16)
    assert abs(float(loss16) - float(loss32)) <= BF16_LOSS * abs(float(loss32))
    assert all(g.dtype == torch.float32 and g.is_cuda and torch.isfinite(g).all() for g in grads16)
    flat16, flat32 = torch.cat([g.reshape(-1) for g in grads16]), torch.cat([g.reshape(-1) for g in grads32])
    assert float((flat16 - flat32).norm() / flat32.norm()) < BF16_NORM
    for info, g16, g32 in zip(fp32.infos, grads16, grads32):
        if float(g32.norm()) > 0:
            cosine = float(torch.nn.functional.cosine_similarity(g16.reshape(-1), g32.reshape(-1), dim=0))
            assert cosine > BF16_COSINE, (info.name, cosine)
    sums16 = eval_sums(bf16, images, labels, torch.bfloat16)
    assert abs(sums16[0] - eval_sums(fp32, images, labels)[0]) <= BF16_LOSS * abs(sums16[0])


# ------------------------------------------------------------ the trainer's steps on the device
def _steps(precision: str = "fp32", *, overlap: bool = False, seed: int = 4):
    backend = TorchBackend(precision)
    rank = backend.init_rank(1, 1)
    spec = get_net("cifar10_quick")       # three channels: the NHWC batch is a channels-last NCHW view
    net = backend.build_net(spec, seed, None, None)
    config = SolverConfig(base_lr=0.01, momentum=0.9, weight_decay=0.0005)
    solver = backend.make_solver(config, net, [i.name for i in net.infos], [1.0] * len(net.infos),
                                 [1.0] * len(net.infos))
    return backend.make_steps(net, solver, rank, spec.input_shape, overlap=overlap), spec


def _numpy_batch(spec: NetSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, w, c = spec.input_shape
    return rng.random((n, h, w, c), np.float32), rng.integers(0, spec.num_classes, n).astype(np.int64)


def test_batches_copy_from_pinned_memory_to_cuda_tensors(fp32_numerics):
    """TorchSteps.batch: NHWC NumPy arrays become CUDA tensors through pinned memory, the images an NCHW view in
    channels-last layout (nothing transposed), every value as it was."""
    steps, spec = _steps()
    images, labels = _numpy_batch(spec, 16, 0)
    x, y = steps.batch(images, labels)
    assert x.is_cuda and y.is_cuda and x.dtype == torch.float32 and y.dtype == torch.int64
    assert tuple(x.shape) == (16, 3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x.cpu(), torch.from_numpy(images).permute(0, 3, 1, 2))
    assert torch.equal(y.cpu(), torch.from_numpy(labels))


@pytest.mark.parametrize("overlap", [False, True], ids=["grouped", "overlapped"])
def test_whole_iteration_on_the_gpu_equals_its_parts(overlap, fp32_numerics):
    """The trainer's iteration on the GPU (one call, the host not waiting; grouped or through the overlap's buckets)
    leaves the same weights and loss as gradients, allreduce and apply in turn, after warm_up put everything back."""
    whole, spec = _steps(overlap=overlap)
    parts, _ = _steps()
    for steps in (whole, parts):
        steps.warm_up(16, 1)
    for i in range(3):
        images, labels = whole.batch(*_numpy_batch(spec, 16, i))
        pair = whole.iteration(images, labels, (1, i), 0.01, i, 16, 0.0)
        loss, grads = parts.gradients(images, labels, (1, i))
        summed, pair_parts = parts.allreduce(grads, loss, 0.0)
        parts.apply(summed, 0.01, i, 16)
        _close(pair, pair_parts, f"loss and flag, iteration {i}", tol=1e-6)
    for info, a, b in zip(whole.net.infos, whole.net.params, parts.net.params):
        _close(a, b, info.name, tol=1e-6)
    sums = whole.evaluate(*whole.batch(*_numpy_batch(spec, 32, 9)))
    assert sums.shape == (4,) and sums[3] == 32 and np.isfinite(sums).all()


# ------------------------------------------------------------ firescale train on the GPU
@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """scikit-learn's digits as HDF5 only: a GPU node has no lmdb."""
    out = tmp_path_factory.mktemp("digits-hdf5")
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--formats", "hdf5",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=300)
    return out / "digits"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_firescale_train_on_the_gpu(digits, tmp_path, precision):
    """`firescale train --framework pytorch` of LeNet on digits, one rank, 50 iterations: it trains on cuda:0, records
    the CUDA, cuDNN and NCCL it ran with, reaches a top-1 above 0.85 (0.95 on a CPU at fp32), and writes Caffe's
    snapshot from the GPU's blobs."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "firescale", "train", "--framework", "pytorch", "--precision",
                           precision, "--dataset", str(digits), "--net", "lenet_same", "--solver",
                           str(REPO / "workflow/solvers/lenet-digits.yaml"), "--set", "max_iter=50", "--set",
                           "test_interval=25", "--set", "display=10", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["allreduce"]["device"] == "cuda:0" and result["allreduce"]["library"] == "none"
    versions = result["versions"]
    assert versions["framework"] == "pytorch" and versions["precision"] == precision
    assert versions["process_group"] == "none"
    assert versions["cuda"] and versions["cudnn"] and versions["nccl"], versions
    assert result["iterations"] == 50 and result["status"] == "finished"
    assert result["evals"][-1]["iter"] == 50 and result["evals"][-1]["top1"] > 0.85, result["evals"]
    assert all(np.isfinite(e["loss"]) for e in result["evals"])
    written = {p.suffix for p in (out / "snapshots").iterdir()}
    assert {".caffemodel", ".solverstate"} <= written, written
