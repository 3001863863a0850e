"""Paleo's iteration model: computation from FLOPs and memory traffic, then the allreduce, in sequence."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from firescale.cluster.collectives import (
    launcher_starts_mpi,
    process_group_model,
    resolve_process_group,
    site_allreduce,
)
from firescale.cluster.horovod import site_cycle_time_s
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.model.comm import Link, canonical_algorithm
from firescale.model.cycle import cycle_wait
from firescale.model.hierarchy import NodeLinks, algorithm_label, hierarchical_choice, node_counts, two_level_allreduce
from firescale.model.io_time import DataPath, fetch_then_compute, h2d_time, io_time
from firescale.model.layers import NetCost, branch_bounds, net_cost
from firescale.model.paleo_flops import paleo_net_cost
from firescale.model.profile import LayerProfile, layer_times, read_profile, update_time
from firescale.nets.spec import Conv, Dropout, NetSpec, Pool, ReLU, Softmax
from firescale.nets.zoo import get_net

IMAGENET_TRAIN_IMAGES = 1_200_000   # Paleo's and FireCaffe's ImageNet-1k training-set size
ACCOUNTINGS = ("firescale", "paleo")  # whose per-layer counts a Platform uses (model/layers.py, model/paleo_flops.py)


@dataclass(frozen=True)
class Device:
    """One accelerator: peak FLOP/s, memory bandwidth (bytes/s) and the compute percent of peak."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    ppp: float = 1.0

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.memory_bandwidth <= 0 or not (0 < self.ppp <= 1.0):
            raise FirescaleError(f"device {self.name!r} needs peak_flops > 0, memory_bandwidth > 0 and "
                                 f"0 < ppp <= 1, got {self.peak_flops}, {self.memory_bandwidth}, {self.ppp}")


@dataclass(frozen=True)
class Platform:
    """Everything a prediction needs about a site: device, link, allreduce algorithm.

    `overhead_s` is an extension beyond Paleo: a fixed time every iteration pays whatever the batch
    (the framework's per-step dispatch, kernel launches, the Python loop).  Paleo has no such term,
    so it is 0 unless a calibration fits it from single-device runs at two batch sizes; with 0 the
    model is Paleo's and the FireCaffe/NiN acceptance figures are unchanged.  `contention` is the
    other extension: how much slower a rank computes (overhead included) when the other ranks of
    its node compute beside it, sharing caches and memory bandwidth; 1 unless a calibration measured
    it, and applied only to points of more than one device.  `accounting` "paleo" counts each layer
    as Paleo's own code does (model/paleo_flops.py) instead of as model/layers.py does.
    """

    name: str
    device: Device
    link: Link
    algorithm: str = "tree"
    elementwise: bool = True    # count bias and activation layers (False: leave them out, as Paleo does)
    overhead_s: float = 0.0     # fixed seconds per iteration (not in Paleo; see above)
    contention: float = 1.0     # a rank's compute time when every rank of its node computes, over alone
    # (nodes, factor): the same when every rank of that many nodes computes (contention_at); none: `contention`
    contention_across: tuple[tuple[int, float], ...] = ()
    cycle_s: float = 0.0        # Horovod's negotiation cycle (model/cycle.py); 0: no cycle, as in Paleo
    accounting: str = "firescale"   # or "paleo": Paleo's own per-layer counts (model/paleo_flops.py)
    links: NodeLinks = NodeLinks()  # ranks per node, the intra-node link, hierarchical allreduce (model/hierarchy.py)
    data: DataPath = DataPath()     # read and host-to-device bandwidths for t_io and t_h2d (model/io_time.py)
    # Of each allreduce, the share that runs beside the rank's compute (on a link or device of its own) and so
    # can hide behind backward: 1 on a GPU; 0 where a rank's one core runs both its allreduce and its backward
    # pass; between where a probe measured it (bench/allreduce.py AllreduceMeasurement.hidden_share)
    comm_hidden_share: float = 1.0
    # Paleo's profiled layers: measured layer times of this device in the precision predicted (model/profile.py);
    # None: every layer from its FLOPs and bytes at the device's peak and percent of peak
    profile: LayerProfile | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.accounting not in ACCOUNTINGS:
            raise FirescaleError(f"platform {self.name!r}: accounting must be one of {', '.join(ACCOUNTINGS)}, "
                                 f"not {self.accounting!r}")
        if not (self.overhead_s >= 0 and math.isfinite(self.overhead_s)):
            raise FirescaleError(f"platform {self.name!r}: overhead_s must be a finite number >= 0, "
                                 f"not {self.overhead_s}")
        if not 0 <= self.comm_hidden_share <= 1:
            raise FirescaleError(f"platform {self.name!r}: comm_hidden_share must be in [0, 1], "
                                 f"not {self.comm_hidden_share}")
        if not (self.contention > 0 and math.isfinite(self.contention)):
            raise FirescaleError(f"platform {self.name!r}: contention must be a finite number > 0, "
                                 f"not {self.contention}")
        for nodes, factor in self.contention_across:
            if not (isinstance(nodes, int) and nodes > 1 and factor > 0 and math.isfinite(factor)):
                raise FirescaleError(f"platform {self.name!r}: contention_across pairs 2 or more nodes with a "
                                     f"finite factor > 0, not ({nodes}, {factor})")

    def contention_at(self, gpus: int) -> float:
        """How much longer a rank of a point of `gpus` ranks computes than alone: 1 for one device; else the
        factor measured over the most nodes up to as many as the point spans (`contention_across`), or the one
        node's (`contention`) when none was.  Nodes that share nothing give the one node's factor again; a
        point's nodes that share a host, or its power and cooling, give more."""
        if gpus <= 1:
            return 1.0
        nodes = -(-gpus // self.links.ranks_per_node)
        measured = [(n, f) for n, f in self.contention_across if n <= nodes]
        return max(measured)[1] if measured else self.contention


K20X = Device("NVIDIA K20X", 3.935e12, 250e9)
# Paleo's K20X (paleo/device.py): 3935 GFLOP/s, and "250 GB/s" that its profiler divides bytes by 2**30 and
# by, that is 250 GiB/s = 268.4e9 bytes/s.  Its FLOP and link rates are decimal (1e9).
PALEO_K20X = Device("NVIDIA K20X (Paleo)", 3.935e12, 250 * 2**30)
TITAN_GEMINI = Link(70e9 / 8)


def platform_from_site(site: SiteProfile, *, ppp_compute: float | None = None, ppp_comm: float | None = None,
                       algorithm: str | None = None, precision: str = "fp32") -> Platform:
    """A Platform from a SiteProfile's SI-unit properties, for training in `precision`: the device's peak in it,
    and the site's layer profile measured in it, if it keeps one."""
    device = Device(str(site.config.get("device", {}).get("name", site.name)), site.peak_flops_in(precision),
                    site.device_memory_bandwidth,
                    1.0 if ppp_compute is None else ppp_compute)
    profile_path = site.layer_profile_path(precision)
    profile = None
    if profile_path is not None:
        profile = read_profile(profile_path)
        if profile.precision != precision:
            raise FirescaleError(f"{site.source}: device.precisions.{precision}.profile names {profile_path}, a "
                                 f"profile measured in {profile.precision}, not {precision}")
    link = Link(site.link_bandwidth, site.link_latency, 1.0 if ppp_comm is None else ppp_comm)
    return Platform(site.name, device, link, canonical_algorithm(algorithm) if algorithm else site_algorithm(site),
                    cycle_s=site_cycle_time_s(site), links=site_links(site), data=site_data_path(site),
                    comm_hidden_share=1.0 if site.device_kind == "gpu" else 0.0,   # a CPU rank: one core
                    profile=profile)


def site_algorithm(site: SiteProfile) -> str:
    """The model of the allreduce the site's library runs (cluster/collectives.py), in the model's words."""
    return canonical_algorithm(site_allreduce(site).model)


def site_process_group(site: SiteProfile, requested: str = "auto") -> str:
    """The process group a PyTorch run on `site` sums its gradients over, resolved as its ranks will resolve it
    (cluster.collectives.resolve_process_group): NCCL on a GPU site; on a CPU site MPI where its launcher starts MPI
    ranks and mpi4py imports, else Gloo."""
    import importlib.util

    mpi = (launcher_starts_mpi(site.launcher, site.config.get("srun_mpi"))
           and importlib.util.find_spec("mpi4py") is not None)
    return resolve_process_group(requested, gpu=site.device_kind == "gpu", mpi_ranks=mpi)


def process_group_algorithm(site: SiteProfile, process_group: str) -> str:
    """The model of the allreduce a PyTorch run's `process_group` runs on `site`, in the model's words: Gloo's
    ring, else the site's own (site_algorithm), which the MPI group's MPI_Allreduce and NCCL follow."""
    return canonical_algorithm(process_group_model(process_group, site_allreduce(site).model))


def with_precision(platform: Platform, site: SiteProfile, precision: str) -> Platform:
    """`platform` (the site's, calibrated or not) for training in `precision`: the device's peak in it and the
    site's layer profile measured in it; its percents of peak and everything else kept."""
    if precision == "fp32":
        return platform
    theirs = platform_from_site(site, precision=precision)
    return replace(platform, device=replace(platform.device, peak_flops=theirs.device.peak_flops),
                   profile=theirs.profile)


def site_links(site: SiteProfile) -> NodeLinks:
    """A site's ranks per node, its intra-node link, and whether Horovod's hierarchical allreduce runs: the
    `horovod.hierarchical_allreduce` knob on a GPU site (Horovod 0.28.1's CPU build has no hierarchical
    allreduce, only MPIHierarchicalAllgather, so the knob changes nothing on CPU sites)."""
    intra = site.intra_node_link
    knob = bool((site.config.get("horovod") or {}).get("hierarchical_allreduce", False))
    return NodeLinks(site.gpus_per_node, None if intra is None else Link(*intra),
                     hierarchical=knob and site.device_kind == "gpu")


def site_data_path(site: SiteProfile) -> DataPath:
    """A site's read and host-to-device bandwidths; the trainer reads ahead in a thread only when its
    rank has more than one core (train/trainer.py open_stream), else inline, before each step."""
    read, shared = site.read_bandwidths
    return DataPath(read, shared, site.host_to_device_bandwidth, overlap_io=site.cores_per_rank > 1,
                    read_source="site" if read > 0 else "")


@dataclass(frozen=True)
class PassTimes:
    """Seconds for one iteration's forward, backward and weight-update computation on one device."""

    forward: float
    backward: float
    update: float
    layer_forward: tuple[float, ...] = field(default=(), repr=False)
    layer_backward: tuple[float, ...] = field(default=(), repr=False)
    # where each layer's figures came from (model/profile.py: measured, fitted FAMILY, peak); empty: all peak
    layer_sources: tuple[str, ...] = field(default=(), repr=False)
    update_source: str = "peak"

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.update

    def scaled(self, factor: float) -> PassTimes:
        """Every pass and layer `factor` times as long (a node's ranks contending, Platform.contention)."""
        return PassTimes(self.forward * factor, self.backward * factor, self.update * factor,
                         tuple(t * factor for t in self.layer_forward), tuple(t * factor for t in self.layer_backward),
                         self.layer_sources, self.update_source)


def _op_time(flops: float, memory_bytes: float, device: Device) -> float:
    # Paleo 3.1.1: C(f, d) = FLOPs / speed plus R + W = bytes / memory bandwidth, both at the PPP.
    return (flops / device.peak_flops + memory_bytes / device.memory_bandwidth) / device.ppp


def compute_times(cost: NetCost, device: Device, *, elementwise: bool = True,
                  profile: LayerProfile | None = None) -> PassTimes:
    """Forward, backward and update times of one batch on `device`, layer by layer.

    With a `profile` (Paleo's profiled layers, model/profile.py) each layer's time is measured or fitted from it
    where it can be, and `elementwise` is moot: measured layers take the time they took.

    With `elementwise=False` bias additions and activation layers cost nothing, as in Paleo
    ("they are by no means the bottleneck"); their entries in the per-layer tuples are 0.  A cost in
    Paleo's accounting (`cost.accounting == "paleo"`) has its update at the device's peak, as Paleo's
    simulation gives its update profiler no percent of peak.
    """
    if profile is not None:
        return _profiled_times(cost, device, profile)

    def keep(l: Any) -> bool:
        return elementwise or not l.elementwise

    def bias(l: Any) -> float:
        return 0.0 if elementwise else l.bias_flops

    fwd = tuple(_op_time(l.forward_flops - bias(l), l.forward_memory_bytes, device) if keep(l) else 0.0
                for l in cost.layers)
    bwd = tuple(_op_time(l.backward_flops - bias(l), l.backward_memory_bytes, device) if keep(l) else 0.0
                for l in cost.layers)
    # Update w -= lr * dw: 2 FLOPs per parameter; read weights and gradients, write weights.
    update_device = replace(device, ppp=1.0) if cost.accounting == "paleo" else device
    update = _op_time(2.0 * cost.params, 3.0 * cost.weight_bytes, update_device)
    return PassTimes(sum(fwd), sum(bwd), update, fwd, bwd)


def _profiled_times(cost: NetCost, device: Device, profile: LayerProfile) -> PassTimes:
    times = layer_times(cost, profile, device.peak_flops, device.memory_bandwidth, device.ppp)
    update, update_source = update_time(cost.params, cost.weight_bytes, profile, device.peak_flops,
                                        device.memory_bandwidth, device.ppp)
    fwd, bwd = tuple(t.forward_s for t in times), tuple(t.backward_s for t in times)
    return PassTimes(sum(fwd), sum(bwd), update, fwd, bwd, tuple(t.source for t in times), update_source)


@dataclass(frozen=True)
class Prediction:
    """One sweep point predicted: per-iteration times (s), training time to the target and speedup."""

    net: str
    platform: str
    gpus: int
    batch: int                 # global batch per iteration
    batch_per_gpu: int
    scaling: str
    algorithm: str
    forward_s: float
    backward_s: float
    update_s: float
    comm_s: float
    iteration_s: float         # the model's iteration time (sequential, or overlapped when asked)
    iteration_sequential_s: float
    iteration_overlap_s: float
    epochs: float
    dataset_size: int
    iterations: int
    time_to_accuracy_s: float
    speedup: float
    gradient_bytes: int
    ppp_compute: float
    ppp_comm: float
    overlap: bool
    overhead_s: float = 0.0    # the platform's fixed per-iteration time, included in the iteration times
    comm_algorithm: str = ""   # the model of what runs for the whole gradient (`algorithm` resolved)
    cycle_wait_s: float = 0.0  # the iteration's wait for Horovod's negotiation cycle (model/cycle.py), as `overlap`
    # Paleo's lower bound on iteration_sequential_s: each block's branches run concurrently (the sequential
    # iteration runs them in series, the upper bound); the same for a net without branches
    iteration_sequential_lower_s: float = 0.0
    # Paleo's scale-up / scale-out split of comm_s (model/hierarchy.py), and the DAG model's data tasks
    comm_intra_s: float = 0.0  # the allreduce's steps the intra-node link bounds
    comm_inter_s: float = 0.0  # its steps the link between nodes bounds
    io_s: float = 0.0          # t_io: reading the rank's batch, its node's ranks sharing the read bandwidth
    h2d_s: float = 0.0         # t_h2d: copying it to the device
    nodes: int = 1             # nodes the point's ranks fill, ranks_per_node to a node

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def backward_share(platform: Platform, spec: NetSpec, batch: int) -> float:
    """The backward pass's share of one device's compute for `batch` images: the window an overlapped
    allreduce can hide behind, as a share of a measured step."""
    times = compute_times(platform_cost(platform, spec, batch), platform.device, elementwise=platform.elementwise,
                          profile=platform.profile)
    return times.backward / times.compute if times.compute > 0 else 0.0


def per_gpu_batch(batch: int, gpus: int, scaling: str) -> int:
    """Images per device and iteration: strong scaling splits `batch`, weak scaling keeps it per device."""
    if scaling == "strong":
        return max(1, math.ceil(batch / gpus))
    if scaling == "weak":
        return batch
    raise FirescaleError(f"scaling must be 'strong' or 'weak', not {scaling!r}")


def _resolve_net(net: NetSpec | str) -> NetSpec:
    return get_net(net) if isinstance(net, str) else net


def platform_cost(platform: Platform, spec: NetSpec, batch: int) -> NetCost:
    """Per-layer costs of `batch` images of `spec` in the platform's accounting."""
    return paleo_net_cost(spec, batch) if platform.accounting == "paleo" else net_cost(spec, batch)


def _point(spec: NetSpec, platform: Platform, gpus: int, batch: int, scaling: str, algorithm: str,
           overlap: bool, io_s: float, image_bytes: float
           ) -> tuple[int, int, PassTimes, float, float, float, int, float, float, Any, tuple[float, float]]:
    local = per_gpu_batch(batch, gpus, scaling)
    cost = platform_cost(platform, spec, local)
    times = compute_times(cost, platform.device, elementwise=platform.elementwise, profile=platform.profile)
    contention = platform.contention_at(gpus)
    if contention != 1.0:
        times = times.scaled(contention)
    overhead = platform.overhead_s * contention
    parts = two_level_allreduce(algorithm, cost.weight_bytes, gpus, platform.link, platform.links)
    comm = parts.total
    # The DAG model's data tasks: a given io_s stands for t_io; else the site's read bandwidths give it.
    io = io_s or io_time(local, image_bytes, gpus, platform.links.ranks_per_node, platform.data)
    h2d = h2d_time(local, spec.input_shape, platform.data)

    def in_sequence(compute: float) -> tuple[float, float]:
        work = fetch_then_compute(io, h2d, compute + comm, platform.data.overlap_io) + overhead
        # Beyond Paleo: the allreduce waits for Horovod's next negotiation cycle (one device has none).
        wait = cycle_wait(work, platform.cycle_s) if gpus > 1 else 0.0
        return work + wait, wait
    sequential, wait = in_sequence(times.compute)
    lower, _ = in_sequence(branch_bounds(spec, times.layer_forward)[0] + branch_bounds(spec, times.layer_backward)[0]
                           + times.update)
    from firescale.model.dag import wait_free_schedule  # the DAG model's overlapped schedule (Eq. 4-5)
    # Of each gradient's allreduce, the hidden share runs on the link beside backward (the DAG model's task);
    # the rest is the rank's core's work and runs in series with its compute, here with the update.
    share = platform.comm_hidden_share
    layer_comm = [two_level_allreduce(algorithm, l.weight_bytes, gpus, platform.link, platform.links).total
                  if l.params else 0.0 for l in cost.layers]
    overlapped = wait_free_schedule(list(times.layer_forward), list(times.layer_backward),
                                    [c * share for c in layer_comm],
                                    update=times.update + sum(layer_comm) * (1 - share), io=io, h2d=h2d,
                                    overlap_io=platform.data.overlap_io).iteration + overhead
    if share == 0:   # nothing to hide behind: the core that computes also communicates
        overlapped = sequential
    elif gpus > 1:   # beyond the DAG model: the last gradient's request, at the end of backward, waits for a cycle too
        overlap_wait = cycle_wait(overlapped, platform.cycle_s)
        overlapped += overlap_wait
        wait = overlap_wait if overlap else wait
    global_batch = batch if scaling == "strong" else batch * gpus
    return local, global_batch, times, comm, sequential, overlapped, cost.weight_bytes, wait, lower, parts, (io, h2d)


def predict_point(site: SiteProfile | Platform, net: NetSpec | str, gpus: int, batch: int, *, epochs: float = 1.0,
                  dataset_size: int = IMAGENET_TRAIN_IMAGES, scaling: Literal["strong", "weak"] = "strong",
                  algorithm: str | None = None, overlap: bool = False, io_s: float = 0.0,
                  image_bytes: float | None = None, calibration: Any = None) -> Prediction:
    """Predict one sweep point: `gpus` devices training `net` at `batch` for `epochs` over `dataset_size`.

    `site` is a Platform or a SiteProfile; `calibration` (a predict.calibrate.Calibration) replaces the
    percent-of-peak factors.  The speedup is against one device training the same global batch
    (strong scaling) or against one device's throughput (weak scaling).
    """
    if gpus < 1 or batch < 1:
        raise FirescaleError(f"gpus and batch must be at least 1, got gpus={gpus}, batch={batch}")
    if epochs <= 0 or dataset_size < 1:
        raise FirescaleError(f"epochs must be > 0 and dataset_size >= 1, got {epochs}, {dataset_size}")
    platform = site if isinstance(site, Platform) else platform_from_site(site)
    if calibration is not None:
        platform = calibration.apply(platform)
    hierarchical, name = hierarchical_choice(algorithm or platform.algorithm, platform.links.hierarchical)
    platform = replace(platform, links=replace(platform.links, hierarchical=hierarchical))
    algo = canonical_algorithm(name)
    spec = _resolve_net(net)
    # Bytes read per image: the stored image (uint8 pixels of the net's input unless the dataset says otherwise).
    image_bytes = float(math.prod(spec.input_shape)) if image_bytes is None else image_bytes
    (local, global_batch, times, comm, seq, ovl, wbytes, wait, lower, parts,
     (io, h2d)) = _point(spec, platform, gpus, batch, scaling, algo, overlap, io_s, image_bytes)
    iteration = ovl if overlap else seq
    iterations = math.ceil(epochs * dataset_size / global_batch)
    base = _point(spec, platform, 1, batch, scaling, algo, overlap, io_s, image_bytes)
    base_batch, base_seq, base_ovl = base[1], base[4], base[5]
    base_iteration = base_ovl if overlap else base_seq
    # Images per second relative to one device.
    speedup = (global_batch / iteration) / (base_batch / base_iteration)
    return Prediction(spec.name, platform.name, gpus, global_batch, local, scaling, algo,
                      times.forward, times.backward, times.update, comm, iteration, seq, ovl,
                      float(epochs), int(dataset_size), iterations, iterations * iteration, speedup,
                      wbytes, platform.device.ppp, platform.link.ppp, overlap, platform.overhead_s,
                      algorithm_label(algo, wbytes, gpus, platform.link, platform.links), wait, lower,
                      parts.intra, parts.inter, io, h2d, node_counts(gpus, platform.links.ranks_per_node)[0])


def predict_sweep(site: SiteProfile | Platform, net: NetSpec | str, gpus: list[int], batches: list[int],
                  **kwargs: Any) -> list[Prediction]:
    """predict_point for every (batch, gpus) pair, batches outermost."""
    return [predict_point(site, net, g, b, **kwargs) for b in batches for g in gpus]


# ------------------------------------------------------------ the FireCaffe / NiN case (Paleo Table 3)

# Paleo's nets/nin.json pools with TensorFlow's VALID rounding (floor): 26, 12 and 5 pixels after
# pool1-3 where Caffe (ceil) gives 27, 13 and 6, and a 5x5 average pool at the end.
def paleo_nin() -> NetSpec:
    """NiN as Paleo modelled it: the same layers with floor-rounded pooling."""
    spec = get_net("nin")
    layers = tuple(replace(l, rounding="floor") if isinstance(l, Pool) else l for l in spec.layers)
    return replace(spec, name="nin-paleo", layers=layers)


def paleo_alexnet() -> NetSpec:
    """AlexNet as Paleo modelled it (its nets/alex_v2.json, TF-slim's alexnet_v2 of "one weird trick"):
    224x224 input, 64 and 192 filters in conv1 and conv2, no groups and no LRN, floor-rounded pooling,
    and fc6, fc7, fc8 as 5x5 and 1x1 convolutions."""
    def conv(name: str, out: int, kernel: int, stride: int = 1, pad: int = 0) -> tuple[Conv, ReLU]:
        return Conv(name, out, kernel, stride, pad), ReLU(f"relu_{name}")

    def pool(name: str) -> Pool:
        return Pool(name, "max", 3, 2, rounding="floor")
    layers = (*conv("conv1", 64, 11, stride=4), pool("pool1"), *conv("conv2", 192, 5, pad=2), pool("pool2"),
              *conv("conv3", 384, 3, pad=1), *conv("conv4", 384, 3, pad=1), *conv("conv5", 256, 3, pad=1),
              pool("pool5"), *conv("fc6", 4096, 5), Dropout("dropout6"), *conv("fc7", 4096, 1),
              Dropout("dropout7"), Conv("fc8", 1000, 1), Softmax())
    return NetSpec("alexnet-paleo", (224, 224, 3), 1000, layers, "TF-slim alexnet_v2 (Paleo's nets/alex_v2.json)")


def paleo_alexnet_1gpu() -> NetSpec:
    """Paleo's nets/alex_v2_1gpu.json, the net of its Table 2 AlexNet step and of Table 4: the one-tower
    AlexNet of Krizhevsky's "one weird trick", paleo_alexnet() with 256 filters in conv4 instead of 384."""
    spec = paleo_alexnet()
    layers = tuple(replace(l, out=256) if isinstance(l, Conv) and l.name == "conv4" else l for l in spec.layers)
    return replace(spec, name="alexnet-paleo-1gpu", layers=layers,
                   init="one weird trick's AlexNet (Paleo's nets/alex_v2_1gpu.json)")


@dataclass(frozen=True)
class PublishedCase:
    """One row of Paleo's Table 3: FireCaffe's measured time beside Paleo's estimate, in seconds."""

    gpus: int
    batch: int
    firecaffe_s: float
    firecaffe_speedup: float
    paleo_s: float
    paleo_speedup: float


HOUR, DAY = 3600.0, 86400.0
PALEO_TABLE3 = (
    PublishedCase(1, 256, 5.8 * DAY, 1.0, 4.9 * DAY, 1.0),
    PublishedCase(32, 256, 11 * HOUR, 13.0, 7.6 * HOUR, 15.5),
    PublishedCase(32, 1024, 6 * HOUR, 23.0, 4.6 * HOUR, 25.3),
    PublishedCase(128, 1024, 3.6 * HOUR, 39.0, 2.3 * HOUR, 51.6),
)
FIRECAFFE_NIN_EPOCHS = 47
# Paleo's Table 2, case 1: "one step time" (forward, backward and update of one batch on one worker),
# 1918 ms for NiN at batch 256 on one K20X, the step behind Table 3's first row.
PALEO_TABLE2_NIN_STEP_S = 1.918
PALEO_PPP_COMPUTE, PALEO_PPP_COMM = 0.21, 0.56
# Table 2's AlexNet step: nets/alex_v2_1gpu.json at batch 128 on one K20, 402 ms.  Paleo's
# scripts/exp_case_hybrid.sh runs it at percent of peak 0.46 and 0.75 over PCIe 2.0 (paleo/device.py:
# K20 3520 GFLOP/s and "208 GB/s", GiB/s as for the K20X; PCIe 2.0 64 Gbit/s).
PALEO_TABLE2_ALEXNET_STEP_S = 0.402
PALEO_K20 = Device("NVIDIA K20 (Paleo)", 3.52e12, 208 * 2**30)
PCIE2 = Link(64e9 / 8)


def firecaffe_platform() -> Platform:
    """Titan as Paleo modelled it: Paleo's K20X, 70 Gbit/s links, tree allreduce, PPP 0.21 and 0.56, and
    each layer counted as Paleo's own code counts it."""
    return Platform("titan (Paleo case 1)", replace(PALEO_K20X, ppp=PALEO_PPP_COMPUTE),
                    replace(TITAN_GEMINI, ppp=PALEO_PPP_COMM), "tree", elementwise=False, accounting="paleo")


def alexnet_case_platform() -> Platform:
    """K20s on PCIe 2.0 as Paleo's scripts/exp_case_hybrid.sh models them: tree allreduce, percent of peak
    0.46 and 0.75, each layer counted as Paleo's own code counts it."""
    return Platform("K20 on PCIe 2.0 (Paleo's AlexNet case)", replace(PALEO_K20, ppp=0.46),
                    replace(PCIE2, ppp=0.75), "tree", elementwise=False, accounting="paleo")


def firecaffe_case(spec: NetSpec | None = None) -> list[tuple[PublishedCase, Prediction]]:
    """Our predictions for Paleo's Table 3 rows (NiN, 47 epochs of 1.2M images, strong scaling)."""
    spec = spec or paleo_nin()
    platform = firecaffe_platform()
    return [(row, predict_point(platform, spec, row.gpus, row.batch, epochs=FIRECAFFE_NIN_EPOCHS))
            for row in PALEO_TABLE3]
