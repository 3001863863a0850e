"""The frameworks firescale trains with: one frozen record per backend, and the only place that names them.

Everything outside the backends (`train/tensorflow/`, `train/torch/`) that needs a fact about a framework, such
as its allreduce library, its precisions, whether it splits layers over devices or which signal its GPU jobs
take before walltime, reads it here instead of comparing names.  A third backend is one more record here and
one more folder under `train/`.  This module imports no framework, so the model, the cluster and the sweep read
it freely.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from firescale.errors import FirescaleError

# fp32: Caffe's numerics (TF32 off); tf32: float32 values, matrix products in TF32 on GPUs that have it;
# bf16: the forward and backward passes autocast to bfloat16, the weights and the update in float32.
PRECISIONS = ("fp32", "tf32", "bf16")
DEFAULT_PRECISION = "fp32"
# The PyTorch trainer's process groups (`firescale train --process-group`): auto is NCCL on GPUs; on CPUs MPI
# (mpi4py on the tensors' memory) where MPI started the ranks, else Gloo (cluster/collectives.py resolves it).
PROCESS_GROUPS = ("auto", "gloo", "mpi", "nccl")
# The plain-MPI algorithms `bench allreduce` times beside the frameworks' own (bench/mpi_algorithms.py): FireCaffe's
# parameter server and reduction tree, a ring, and the MPI library's own MPI_Allreduce, every framework's yardstick.
MPI_ALLREDUCE = "mpi"
MPI_ALGORITHMS = ("ps", "tree", "ring", MPI_ALLREDUCE)


@dataclass(frozen=True)
class Framework:
    """One backend: where it lives, whose allreduce it calls, and what it can do."""

    name: str                       # --framework and the experiments' `framework:`
    module: str                     # the backend module, imported only when chosen (train/backend.load_backend)
    library: str                    # whose allreduce its trainer calls, in people's words
    algorithm: str                  # that allreduce as `bench allreduce --algorithms` names it
    needs: str                      # what to install when its module will not import
    version_key: str                # the key of a run record's `versions` that only this framework writes
    stack_versions: tuple[str, ...]  # the versions a kept calibration is keyed by (predict/calibration_key.py)
    precisions: tuple[str, ...]     # a subset of PRECISIONS
    process_groups: tuple[str, ...]  # what --process-group may name; ("auto",): the library's own ranks
    bare_loop: str                  # bench/: the loop a user would write with it, the trainer's yardstick
    bare_loop_label: str
    knobs: str                      # what `bench knobs` calls its tuning knobs (a site's horovod: block, or torch's)
    site_knobs: str | None          # the site.yaml block of its allreduce's knobs, if it reads one
    layer_plans: bool               # splits a net's layers over devices (a dist plan: model parallelism)
    profile_layers: bool            # `firescale train --profile-layers`
    probe_overlap: bool             # its allreduce probe can time how much hides behind backward (--probe-overlap)
    negotiation_cycle: bool         # its allreduce waits for a background cycle: probed after a step, not alone
    gpu_build_check: bool           # a GPU job first asks whether its library was built for GPUs
    gpu_walltime_signal: str        # the `auto` walltime signal of its GPU jobs (NCCL may take USR1 for itself)
    collective_timeout: str         # how a site's collective_timeout reaches it: 'process_group' or 'stall_check'
    overlap_bucket_mb: float | None = None   # the overlapped allreduce's default bucket, where it buckets
    allreduce_probe: str = ""       # bench/: the module that times its trainer's allreduce (`bench allreduce`)
    bench_default: tuple[str, ...] = ("ps", "tree", "ring")   # `bench allreduce --algorithms` left out, with it
    graph_call: bool = False        # its trainer calls the allreduce inside a traced graph (bench: graph_call_s)
    # the modules whose versions its runs record, each with the distributions that install it (report/provenance.py)
    distributions: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def names_process_group(self) -> bool:
        """Whether --process-group chooses among several groups for it (else its ranks are its library's)."""
        return len(self.process_groups) > 1


TENSORFLOW = Framework(
    name="tensorflow", module="firescale.train.tensorflow.backend", library="Horovod", algorithm="horovod",
    needs="TensorFlow and Horovod (`make setup`)", version_key="tensorflow",
    stack_versions=("tensorflow", "horovod", "mpi"), precisions=("fp32", "tf32"), process_groups=("auto",),
    bare_loop="firescale.bench.bare_loop", bare_loop_label="the bare Horovod loop", knobs="horovod",
    site_knobs="horovod", layer_plans=True, profile_layers=True, probe_overlap=True, negotiation_cycle=True,
    gpu_build_check=True, gpu_walltime_signal="USR1", collective_timeout="stall_check",
    allreduce_probe="firescale.bench.allreduce_tensorflow", graph_call=True,
    distributions=(("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")),
                   ("horovod", ("horovod",))))

PYTORCH = Framework(
    name="pytorch", module="firescale.train.torch.backend", library="torch.distributed", algorithm="torch",
    needs="PyTorch (`make setup`, or `pip install 'firescale[pytorch]'`)", version_key="torch",
    stack_versions=("torch", "cuda", "nccl", "mpi"), precisions=PRECISIONS, process_groups=PROCESS_GROUPS,
    bare_loop="firescale.bench.bare_loop_torch", bare_loop_label="the bare PyTorch loop", knobs="torch",
    site_knobs=None, layer_plans=False, profile_layers=False, probe_overlap=False, negotiation_cycle=False,
    gpu_build_check=False, gpu_walltime_signal="USR2", collective_timeout="process_group",
    overlap_bucket_mb=25.0, allreduce_probe="firescale.bench.allreduce_torch", bench_default=(MPI_ALLREDUCE, "torch"),
    distributions=(("torch", ("torch",)), ("mpi4py", ("mpi4py",))))   # mpi4py: its MPI process group

REGISTRY: Mapping[str, Framework] = {f.name: f for f in (TENSORFLOW, PYTORCH)}
FRAMEWORKS = tuple(REGISTRY)
DEFAULT_FRAMEWORK = TENSORFLOW.name
# each framework's own allreduce, as `bench allreduce` names it; a run times one framework's
FRAMEWORK_ALGORITHMS = tuple(f.algorithm for f in REGISTRY.values())
BENCH_ALGORITHMS = (*MPI_ALGORITHMS, *FRAMEWORK_ALGORITHMS)


def framework(name: str, where: str = "--framework") -> Framework:
    """The record of the framework called `name`; one sentence naming `where` when there is none."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise FirescaleError(f"{where} {name!r} is not a framework firescale trains with; use one of "
                             f"{', '.join(FRAMEWORKS)}") from None


def check_framework(name: str, where: str = "--framework") -> str:
    return framework(name, where).name


def check_precision(precision: str, where: str = "--precision") -> str:
    if precision not in PRECISIONS:
        raise FirescaleError(f"{where} {precision!r} is not a precision firescale trains in; use one of "
                             f"{', '.join(PRECISIONS)}")
    return precision


def by_algorithm(algorithm: str) -> Framework | None:
    """The framework whose trainer's allreduce `bench allreduce` calls `algorithm`; None for the MPI algorithms."""
    return next((f for f in REGISTRY.values() if f.algorithm == algorithm), None)


def from_versions(versions: Mapping[str, object]) -> Framework | None:
    """The framework a run record's `versions` names (`framework`), else the one whose version it holds (records
    from before runs named their backend); None when it says neither."""
    named = versions.get("framework")
    if isinstance(named, str) and named in REGISTRY:
        return REGISTRY[named]
    return next((f for f in REGISTRY.values() if f.version_key in versions), None)


def check_combination(name: str, precision: str, process_group: str, where: str = "") -> Framework:
    """The framework `name`, checked with the precision and process group asked of it: one sentence, prefixed by
    `where` (a file and experiment), for a pair it does not train with."""
    def label(key: str, option: str) -> str:
        return f"{where}{key}" if where else option

    chosen = framework(name, label("framework", "--framework"))
    check_precision(precision, label("precision", "--precision"))
    if precision not in chosen.precisions:
        others = [f.name for f in REGISTRY.values() if precision in f.precisions]
        raise FirescaleError(f"{label('precision', 'precision')} {precision!r} is the {' or '.join(others)} backend's; "
                             f"the {chosen.name} backend trains in {' or '.join(chosen.precisions)} (set framework "
                             f"{' or '.join(others)} to train in {precision})")
    group = label("process_group", "--process-group")
    if process_group not in PROCESS_GROUPS:
        raise FirescaleError(f"{group} {process_group!r} is not one of {', '.join(PROCESS_GROUPS)}")
    if process_group not in chosen.process_groups:
        others = [f.name for f in REGISTRY.values() if f.names_process_group]
        raise FirescaleError(f"{group} {process_group} picks the {' or '.join(others)} backend's process group; the "
                             f"{chosen.name} backend's ranks are {chosen.library}'s (set framework "
                             f"{' or '.join(others)}, or leave it out)")
    return chosen
