"""The allreduce vocabulary: a site's choice, the MPI/NCCL settings for it, what a run used, and its cost model."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from firescale.errors import FirescaleError
from firescale.frameworks import PROCESS_GROUPS

if TYPE_CHECKING:  # annotations only
    from firescale.cluster.site import SiteProfile

SITE_ALGORITHMS = ("tree", "ring", "default")   # site.yaml allreduce.algorithm
TREE_SHAPES = ("binomial", "binary")       # site.yaml allreduce.tree: the shape of MPI's reduce and broadcast

# Open MPI's coll/tuned algorithms, numbered and named as `ompi_info --param coll tuned --level 9` lists them
# ("Valid values") in Open MPI 4.1; the job script sets the numbers, Open MPI also accepts the names.
OMPI_ENUMS: dict[str, dict[int, str]] = {
    "allreduce": {0: "ignore", 1: "basic_linear", 2: "nonoverlapping", 3: "recursive_doubling", 4: "ring",
                  5: "segmented_ring", 6: "rabenseifner"},
    "reduce": {0: "ignore", 1: "linear", 2: "chain", 3: "pipeline", 4: "binary", 5: "binomial",
               6: "in-order_binary", 7: "rabenseifner"},
    "bcast": {0: "ignore", 1: "basic_linear", 2: "chain", 3: "pipeline", 4: "split_binary_tree", 5: "binary_tree",
              6: "binomial", 7: "knomial", 8: "scatter_allgather", 9: "scatter_allgather_ring"},
}

# What Open MPI must run, per collective, for a site's ring or tree.  A tree allreduce is Open MPI's
# "nonoverlapping" one: a reduce to rank 0, then a broadcast, each down a tree of the site's shape.
OMPI_RING = {"allreduce": "ring"}
OMPI_TREE = {"binomial": {"allreduce": "nonoverlapping", "reduce": "binomial", "bcast": "binomial"},
             "binary": {"allreduce": "nonoverlapping", "reduce": "binary", "bcast": "binary_tree"}}
NCCL_ALGO = {"tree": "Tree", "ring": "Ring"}   # NCCL_ALGO values (NCCL reads them case-insensitively)

# Cost models (model/comm.py) of what each library's allreduce runs.  A nonoverlapping allreduce whose
# reduce and broadcast are left to Open MPI's own rules is modelled as the binomial tree.
OMPI_ALLREDUCE_MODEL = {"basic_linear": "ps", "nonoverlapping": "tree", "recursive_doubling": "butterfly",
                        "ring": "ring", "segmented_ring": "ring", "rabenseifner": "rabenseifner"}
TREE_MODEL = {"binomial": "tree", "binary": "binary-tree"}
TREE_MODELS = frozenset(TREE_MODEL.values())
# A library's own choice, resolved per message size and rank count (model/comm.py resolves them).
DEFAULT_MODELS = {"openmpi": "openmpi-default", "cray-mpich": "mpich-default", "nccl": "nccl-default"}

# The MPI library a launcher implies: ALPS's aprun starts Cray MPICH; every other launcher here runs
# the stack's Open MPI (Horovod is built against it).
MPI_BY_LAUNCHER = {"aprun": "cray-mpich"}

# Open MPI 4.1.0-5.0.x coll/tuned fixed decision for a commutative MPI_Allreduce
# (ompi/mca/coll/tuned/coll_tuned_decision_fixed.c): for communicators smaller than each size bound,
# the algorithm number for messages smaller than each byte bound (None: no bound).
_OMPI_FIXED_ALLREDUCE: tuple[tuple[int | None, tuple[tuple[int | None, int], ...]], ...] = (
    (4, ((8, 4), (4096, 3), (8192, 4), (16384, 3), (65536, 4), (262144, 5), (None, 6))),
    (8, ((16, 4), (8192, 3), (None, 6))),
    (16, ((8192, 3), (None, 6))),
    (32, ((64, 5), (4096, 3), (None, 6))),
    (64, ((128, 5), (None, 6))),
    (128, ((262144, 3), (None, 6))),
    (256, ((131072, 2), (262144, 3), (None, 6))),
    (512, ((4096, 2), (None, 6))),
    (2048, ((2048, 2), (16384, 3), (None, 6))),
    (4096, ((2048, 2), (4096, 5), (16384, 3), (None, 6))),
    (None, ((2048, 2), (16384, 5), (32768, 3), (None, 6))),
)
MPICH_SHORT_MESSAGE = 2048   # MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE's default (bytes)


def openmpi_default_allreduce(ranks: int, nbytes: float) -> str:
    """The allreduce Open MPI 4.1's fixed rules run for a sum of `nbytes` over `ranks` ranks (ompi_info's name)."""
    for size_bound, rules in _OMPI_FIXED_ALLREDUCE:
        if size_bound is None or ranks < size_bound:
            for byte_bound, number in rules:
                if byte_bound is None or nbytes < byte_bound:
                    return OMPI_ENUMS["allreduce"][number]
    raise AssertionError("the last rule has no bounds")


def mpich_default_allreduce(ranks: int, nbytes: float, item_bytes: int = 4) -> str:
    """The allreduce MPICH (and Cray MPICH between nodes) runs for a sum: recursive doubling for short
    messages or fewer items than the largest power of two <= ranks, else Rabenseifner's."""
    pof2 = 1 << (max(1, ranks).bit_length() - 1)
    short = nbytes <= MPICH_SHORT_MESSAGE or nbytes // item_bytes < pof2
    return "recursive_doubling" if short else "rabenseifner"


def ompi_number(collective: str, name: str) -> int:
    """Open MPI's number for the algorithm `name` of `collective`."""
    for number, known in OMPI_ENUMS[collective].items():
        if known == name:
            return number
    raise FirescaleError(f"Open MPI has no {collective} algorithm {name!r}; known: "
                         f"{', '.join(OMPI_ENUMS[collective].values())}")


def ompi_name(collective: str, value: str | None) -> str | None:
    """The algorithm an OMPI_MCA_coll_tuned_<collective>_algorithm value selects (a number or a name);
    None when unset or invalid (Open MPI then warns and uses its own rules)."""
    if value is None:
        return None
    text = value.strip()
    if re.fullmatch(r"\d+", text):
        return OMPI_ENUMS[collective].get(int(text))
    return text if text in OMPI_ENUMS[collective].values() else None


def mpi_library(launcher: str) -> str:
    return MPI_BY_LAUNCHER.get(launcher, "openmpi")


@dataclass(frozen=True)
class AllreduceChoice:
    """A site's allreduce: the algorithm asked for, its tree shape, and the libraries that carry it."""

    algorithm: str      # tree, ring or default
    tree: str           # binomial or binary
    device_kind: str    # gpu (NCCL sums the gradients) or cpu (MPI does)
    mpi: str            # openmpi or cray-mpich

    def __post_init__(self) -> None:
        if self.algorithm not in SITE_ALGORITHMS:
            raise FirescaleError(f"allreduce.algorithm {self.algorithm!r}; known: {', '.join(SITE_ALGORITHMS)}")
        if self.tree not in TREE_SHAPES:
            raise FirescaleError(f"allreduce.tree {self.tree!r}; known: {', '.join(TREE_SHAPES)}")
        if self.mpi not in ("openmpi", "cray-mpich"):
            raise FirescaleError(f"MPI library {self.mpi!r}; known: openmpi, cray-mpich")

    @property
    def gradient_library(self) -> str:
        """The library that sums the gradients: NCCL on GPUs, else the MPI library."""
        return "nccl" if self.device_kind == "gpu" else self.mpi

    @property
    def ompi_forced(self) -> dict[str, str]:
        """Open MPI's algorithm per collective (empty for `default`)."""
        if self.algorithm == "default":
            return {}
        return dict(OMPI_RING if self.algorithm == "ring" else OMPI_TREE[self.tree])

    def environment(self) -> dict[str, str]:
        """The variables the job exports before launching: read at MPI_Init and NCCL communicator creation."""
        env = {"FIRESCALE_ALLREDUCE": self.algorithm}
        if self.algorithm == "default":
            return env
        if self.algorithm == "tree":
            env["FIRESCALE_ALLREDUCE_TREE"] = self.tree
        if self.mpi == "openmpi":
            env["OMPI_MCA_coll_tuned_use_dynamic_rules"] = "1"
            for collective, name in self.ompi_forced.items():
                env[f"OMPI_MCA_coll_tuned_{collective}_algorithm"] = str(ompi_number(collective, name))
        if self.device_kind == "gpu":
            env["NCCL_ALGO"] = NCCL_ALGO[self.algorithm]
        return env

    @property
    def model(self) -> str:
        """The cost model of what runs: the choice where its library enforces it, else the library's own."""
        library = self.gradient_library
        if self.algorithm == "default" or library == "cray-mpich":
            return DEFAULT_MODELS[library]
        if self.algorithm == "ring":
            return "ring"
        # NCCL runs its own tree whatever the shape; FireCaffe's binomial tree stands in for it.
        return "tree" if library == "nccl" else TREE_MODEL[self.tree]

    def warnings(self) -> list[str]:
        """Where this site cannot enforce the choice, one sentence each (for `site lint`)."""
        out = []
        if self.mpi == "cray-mpich" and self.algorithm != "default":
            if self.device_kind == "cpu":
                out.append(f"allreduce.algorithm {self.algorithm!r} cannot be enforced: launcher aprun starts "
                           "Cray MPICH, which has no setting that selects a tree or ring MPI_Allreduce, so "
                           "Cray MPICH's own choice runs and the prediction models that (mpich-default)")
            else:
                out.append(f"allreduce.algorithm {self.algorithm!r} holds for GPU gradients summed by NCCL "
                           f"(NCCL_ALGO={NCCL_ALGO[self.algorithm]}); launcher aprun starts Cray MPICH, whose "
                           "MPI_Allreduce cannot be set, so CPU tensors and GPU gradients sent through CUDA-aware "
                           "Cray MPICH follow Cray MPICH's own choice")
        if self.device_kind == "gpu" and self.algorithm == "tree" and self.tree == "binary":
            out.append("allreduce.tree 'binary' shapes Open MPI's reduce and broadcast of CPU tensors only; "
                       "NCCL sums the GPU gradients down its own tree")
        return out


def site_allreduce(site: SiteProfile | Mapping[str, Any]) -> AllreduceChoice:
    """The allreduce of a SiteProfile (or of a validated site config mapping)."""
    config = site if isinstance(site, Mapping) else site.config
    allreduce = config.get("allreduce") or {}
    return AllreduceChoice(allreduce.get("algorithm", "tree"), allreduce.get("tree", "binomial"),
                           config["device"].get("kind", "gpu"), mpi_library(config["launcher"]))


@dataclass(frozen=True)
class AllreduceUsed:
    """What summed a run's gradients, decoded from the settings its ranks saw."""

    library: str             # nccl, openmpi, mpich, gloo, or none (one rank)
    algorithm: str           # in the library's own words
    model: str | None        # the cost model of it (model/comm.py); None with one rank

    @property
    def tree(self) -> bool:
        return self.model in TREE_MODELS




def resolve_process_group(requested: str, *, gpu: bool, mpi_ranks: bool) -> str:
    """The process group `requested` (one of PROCESS_GROUPS) means for ranks on GPUs (`gpu`) or on CPUs, started
    by an MPI launcher with mpi4py at hand (`mpi_ranks`): auto is nccl on GPUs, mpi on such CPU ranks, else gloo;
    a named group is itself.  The trainer's ranks (train/torch/distributed.init_rank) and the prediction of their
    allreduce (model/paleo.site_process_group) both resolve it here, so the model prices the group that runs."""
    if requested not in PROCESS_GROUPS:
        raise FirescaleError(f"process group {requested!r} is not known; known: {', '.join(PROCESS_GROUPS)}")
    if requested != "auto":
        return requested
    if gpu:
        return "nccl"
    return "mpi" if mpi_ranks else "gloo"


# The cost model of the PyTorch trainer's process groups whose algorithm no site setting reaches: Gloo's allreduce of
# CPU tensors is its ring (decode_allreduce's "gloo ring").  The MPI group's MPI_Allreduce and NCCL follow the
# site's settings, so they take the site's model.
PROCESS_GROUP_MODELS = {"gloo": "ring"}


def process_group_model(process_group: str, site_model: str) -> str:
    """The cost model of the allreduce a PyTorch run's process group (gloo, mpi, nccl) runs on a site whose own
    allreduce is modelled by `site_model`: the same vocabulary the run's record decodes (decode_allreduce)."""
    return PROCESS_GROUP_MODELS.get(process_group, site_model)


def launcher_starts_mpi(launcher: str, srun_mpi: str | None = None) -> bool:
    """Whether a site's launcher starts its ranks as MPI processes (train/torch/rendezvous.mpi_started reads the
    same from the ranks' side): mpirun and aprun do, srun through an MPI plugin (`srun_mpi`) other than none."""
    if launcher == "srun":
        return srun_mpi not in (None, "", "none")
    return launcher in ("mpirun", "aprun")


def _mca_true(value: str | None) -> bool:
    """Whether Open MPI reads an MCA boolean as true (a non-zero integer, true, yes or enabled)."""
    text = (value or "").strip().lower()
    return int(text) != 0 if re.fullmatch(r"\d+", text) else text in ("true", "yes", "enabled")


def _decode_openmpi(env: Mapping[str, str], ranks: int, nbytes: float | None) -> AllreduceUsed:
    tuned = {c: ompi_name(c, env.get(f"OMPI_MCA_coll_tuned_{c}_algorithm")) for c in OMPI_ENUMS}
    forced = tuned["allreduce"] if _mca_true(env.get("OMPI_MCA_coll_tuned_use_dynamic_rules")) else None
    if forced in (None, "ignore"):
        if nbytes is None:
            return AllreduceUsed("openmpi", "mpi default (Open MPI's fixed rules)", DEFAULT_MODELS["openmpi"])
        name = openmpi_default_allreduce(ranks, nbytes)
        return AllreduceUsed("openmpi", f"mpi {name} (Open MPI's fixed rules for {int(nbytes)} bytes over {ranks} "
                                        "ranks)", OMPI_ALLREDUCE_MODEL[name])
    if forced != "nonoverlapping":
        return AllreduceUsed("openmpi", f"mpi {forced}", OMPI_ALLREDUCE_MODEL[forced])
    reduce, bcast = tuned["reduce"] or "ignore", tuned["bcast"] or "ignore"
    binary = reduce in ("binary", "in-order_binary") and bcast == "binary_tree"
    return AllreduceUsed("openmpi", f"mpi nonoverlapping (reduce {reduce}, bcast {bcast})",
                         "binary-tree" if binary else "tree")


def _decode_nccl(env: Mapping[str, str]) -> AllreduceUsed:
    value = (env.get("NCCL_ALGO") or "").strip()
    known = {v.lower(): k for k, v in NCCL_ALGO.items()}
    if value.lower() in known:
        return AllreduceUsed("nccl", f"nccl {value.lower()}", known[value.lower()])
    what = f"nccl's choice among {value}" if value else "nccl default"
    return AllreduceUsed("nccl", what, DEFAULT_MODELS["nccl"])


def decode_allreduce(env: Mapping[str, str], *, ranks: int, library: str,
                     message_bytes: float | None = None) -> AllreduceUsed:
    """What summed the gradients of a run of `ranks` ranks whose gradients went through `library`
    (nccl, openmpi, mpich or gloo), given the environment its ranks saw.  With `message_bytes` (one
    fused gradient allreduce), a library's own choice is resolved to the algorithm it picks."""
    if ranks <= 1:
        return AllreduceUsed("none", "none (one rank)", None)
    if library == "nccl":
        return _decode_nccl(env)
    if library == "gloo":
        return AllreduceUsed("gloo", "gloo ring", "ring")
    if library == "openmpi":
        return _decode_openmpi(env, ranks, message_bytes)
    if library == "mpich":
        if message_bytes is None:
            return AllreduceUsed("mpich", "mpi default (MPICH's rules)", DEFAULT_MODELS["cray-mpich"])
        name = mpich_default_allreduce(ranks, message_bytes)
        return AllreduceUsed("mpich", f"mpi {name} (MPICH's rules for {int(message_bytes)} bytes over {ranks} ranks)",
                             OMPI_ALLREDUCE_MODEL[name])
    raise FirescaleError(f"unknown allreduce library {library!r}; known: nccl, openmpi, mpich, gloo")
