"""`bench allreduce` without its command line or MPI (bench/allreduce_vs_model.py): which options it refuses, which
algorithms and sizes it times in which order, the models each is set beside, and what rank 0 says and records."""
from __future__ import annotations

import json
import re

import pytest

from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.bench.allreduce_vs_model import (
    AllreduceBench,
    BenchSizes,
    allreduce_bench,
    bench_link,
    bench_sizes,
    models_for,
    run_allreduce_bench,
    table_lines,
    time_allreduces,
)
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.model.comm import Link
from firescale.model.paleo import Device, Platform, platform_from_site

PLATFORM = Platform("ib", Device("gpu", 1e13, 5e11), Link(1.25e9, 2e-6), "ring")


@pytest.mark.parametrize("framework, algorithms, options, message", [
    ("tensorflow", None, {"reps": 0}, "--reps must be at least 1"),
    ("tensorflow", None, {"compute_ms": -1.0}, "--compute-ms must be 0 or more, not -1.0"),
    ("tensorflow", None, {"compute_ms": float("nan")}, "--compute-ms must be 0 or more, not nan"),
    ("tensorflow", None, {"batch_per_rank": 0}, "--batch-per-rank must be at least 1, not 0"),
    ("tensorflow", None, {"overlap_ms": -2.0}, "--overlap-ms must be 0 or more, not -2.0"),
    ("pytorch", None, {"compute_ms": 3.0}, "--compute-ms runs a synthetic TensorFlow step; with --framework pytorch"),
    ("tensorflow", "horovod", {"overlap_ms": 5.0}, "--overlap-ms times Horovod's allreduce beside compute"),
    ("tensorflow", "tree", {"overlap_ms": 5.0, "compute_ms": 5.0},
     "--overlap-ms times Horovod's allreduce beside compute: give --algorithms with horovod and --compute-ms"),
    ("jax", None, {}, "--framework 'jax' is not a framework firescale trains with; use one of tensorflow, pytorch"),
    ("tensorflow", "ring,gossip", {"reps": 0}, "--algorithms: unknown gossip"),     # the names before the numbers
    ("tensorflow", None, {"process_groups": "mpi"}, "--process-groups chooses what torch's allreduce sums over"),
    ("pytorch", "mpi", {"process_groups": "gloo"}, "--process-groups chooses what torch's allreduce sums over"),
    ("pytorch", None, {"process_groups": "gloo,ucc"}, "--process-groups 'gloo,ucc': unknown ucc; known: auto, gloo, "
                                                      "mpi, nccl"),
])
def test_bad_options_are_refused_by_name(framework, algorithms, options, message):
    with pytest.raises(FirescaleError, match=re.escape(message)):
        allreduce_bench(framework, algorithms, **options)


def test_good_options_are_kept_as_given():
    bench = allreduce_bench("tensorflow", " mpi, horovod ,", reps=3, compute_ms=5.0, batch_per_rank=8, overlap_ms=2.0)
    assert bench == AllreduceBench("tensorflow", ("mpi", "horovod"), 3, 5.0, 8, 2.0)
    assert allreduce_bench("pytorch", None).algorithms == ("mpi", "torch")
    assert allreduce_bench("pytorch", None).process_groups == ("auto",)
    assert allreduce_bench("pytorch", None, process_groups=" gloo,mpi ,gloo").process_groups == ("gloo", "mpi")


def test_the_sizes_are_given_swept_or_a_nets_gradients():
    assert bench_sizes() == BenchSizes((30_000_000,))                       # NiN's |W|
    assert bench_sizes(sizes_mb=[0.5, 2]).sizes == (500_000, 2_000_000)
    assert bench_sizes(sweep=True).sizes == (65_536, 262_144, 1_048_576, 4_194_304, 16_777_216, 67_108_864)
    lenet = bench_sizes(gradients_of="lenet_same", input_shape=(8, 8, 1), classes=10)
    # LeNet on 8x8 digits ('same' convolutions, two 2x2 poolings): conv 5x5 1->20 and 20->50, ip 2x2x50->500, ip 500->10
    counts = (500, 20, 25_000, 50, 100_000, 500, 5_000, 10)
    assert (lenet.sizes, sorted(lenet.tensors)) == ((4 * sum(counts),), sorted(counts))
    assert (lenet.input_shape, lenet.gradients_of) == ((8, 8, 1), "lenet_same")
    assert bench_sizes(sizes_mb=[1.0]).input_shape == (1, 1, 1)            # Horovod's iteration is fed one pixel


@pytest.mark.parametrize("options, message", [
    ({"sweep": True, "sizes_mb": [1.0]}, "give one of --sweep, --sizes-mb and --gradients-of, not --sweep and "
                                         "--sizes-mb"),
    ({"sweep": True, "sizes_mb": [1.0], "gradients_of": "nin"},
     "not --sweep and --sizes-mb and --gradients-of"),
    ({"input_shape": (28, 28, 1)}, "--input and --classes describe the net of --gradients-of; give it too"),
    ({"classes": 0}, "--input and --classes describe the net of --gradients-of; give it too"),
    ({"gradients_of": "resnet"}, "unknown net 'resnet'"),
])
def test_sizes_given_twice_or_a_net_described_without_it_are_refused(options, message):
    with pytest.raises(FirescaleError, match=re.escape(message)):
        bench_sizes(**options)


def test_the_link_predicted_on_and_the_rate_a_rank_sums_at():
    assert bench_link(None, reduce_gbs=2.0, from_site=True) == (None, "tree")     # no platform: nothing predicted
    link, algorithm = bench_link(PLATFORM)
    assert (link, algorithm) == (PLATFORM.link, "ring")
    assert bench_link(PLATFORM, reduce_gbs=2.0, from_site=True)[0].reduce_rate == 2e9   # given wins
    assert bench_link(PLATFORM, from_site=True)[0].reduce_rate == pytest.approx(5e11 / 3)
    site = load_site("local")     # a site's platform: the rate of its own device's memory
    assert bench_link(platform_from_site(site), from_site=True)[0].reduce_rate == pytest.approx(
        site.device_memory_bandwidth / 3)


def test_each_algorithm_is_set_beside_its_own_models():
    assert models_for("ps", "ring") == ("ps", "firecaffe-ps")
    assert models_for("tree", "ring") == ("tree",)
    assert [models_for(a, "rabenseifner") for a in ("mpi", "horovod", "torch")] == [("rabenseifner",)] * 3
    # torch's, by the process group it summed over: Gloo's ring whatever the site sets, MPI's and NCCL's the site's
    assert models_for("torch", "tree", "gloo") == ("ring",)
    assert models_for("torch", "tree", "mpi") == models_for("torch", "tree", "nccl") == ("tree",)


class _Comm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size


def _measure(calls: list):
    """A stand-in for measure_allreduce: 1 ns a byte, every call kept."""
    def measure(comm, algorithm, nbytes, reps, **options) -> AllreduceMeasurement:
        calls.append((algorithm, nbytes, reps, options))
        group = options.get("process_group", "")
        return AllreduceMeasurement(algorithm, comm.Get_size(), nbytes, [nbytes * (2 if group == "gloo" else 1) * 1e-9]
                                    * reps, tensors=len(options["tensors"]), process_group=group)
    return measure


def test_every_size_of_each_algorithm_is_timed_a_frameworks_own_last():
    calls: list = []
    bench = AllreduceBench("tensorflow", ("horovod", "tree", "ps"), reps=3, compute_ms=5.0, batch_per_rank=4,
                           overlap_ms=2.0)
    sizes = BenchSizes((1000, 2000), (100, 150), (8, 8, 1), "lenet_same")
    results = time_allreduces(_Comm(0, 4), bench, sizes, PLATFORM.link, "ring", _measure(calls))
    assert [(a, n) for a, n, _, _ in calls] == [("tree", 1000), ("tree", 2000), ("ps", 1000), ("ps", 2000),
                                                ("horovod", 1000), ("horovod", 2000)]
    for algorithm, _, reps, options in calls:
        assert reps == 3 and options["compute_s"] == 0.005 and options["batch"] == 4
        assert options["tensors"] == (100, 150) and options["input_shape"] == (8, 8, 1)
        assert options["overlap_s"] == (0.002 if algorithm == "horovod" else 0.0)   # only Horovod's overlaps
    assert [list(p) for _, p in results] == [["tree"], ["tree"], ["ps", "firecaffe-ps"], ["ps", "firecaffe-ps"],
                                             ["ring"], ["ring"]]
    assert 0 < results[-2][1]["ring"] < results[-1][1]["ring"]     # more bytes, longer
    unpredicted = time_allreduces(_Comm(0, 4), bench, sizes, None, "tree", _measure([]))
    assert all(p == {} for _, p in unpredicted)


def test_torch_s_allreduce_is_timed_over_each_process_group_and_priced_as_that_group_runs():
    calls: list = []
    bench = allreduce_bench("pytorch", None, process_groups="gloo,mpi")
    sizes = BenchSizes((1000,), (150, 100), (8, 8, 1), "lenet_same")
    results = time_allreduces(_Comm(0, 2), bench, sizes, PLATFORM.link, "tree", _measure(calls))
    assert [(a, o.get("process_group")) for a, _, _, o in calls] == [("mpi", None), ("torch", "gloo"),
                                                                     ("torch", "mpi")]
    assert [list(p) for _, p in results] == [["tree"], ["ring"], ["tree"]]   # Gloo's ring, MPI's the site's tree
    lines = table_lines(2, bench, sizes, results, {}, (0.5, 0.75))
    assert [line.split()[0] for line in lines[3:6]] == ["mpi", "torch/gloo", "torch/mpi"]
    pairs = [line.split()[:2] for line in lines if line.split()[1:2] in (["gloo"], ["mpi"])]
    assert pairs == [["1", "gloo"], ["1", "mpi"]]   # KiB and group: each beside MPI_Allreduce of the same bytes


def test_rank_0_says_the_table_and_writes_the_record_the_others_neither(tmp_path):
    bench = AllreduceBench("tensorflow", ("ps", "mpi", "horovod"), reps=2)
    sizes = BenchSizes((1000,))
    out = tmp_path / "allreduce.json"
    said: list[str] = []
    run_allreduce_bench(_Comm(1, 3), bench, sizes, PLATFORM.link, "ring", json_path=str(out), say=said.append,
                        measure=_measure([]))
    assert said == [] and not out.exists()
    run_allreduce_bench(_Comm(0, 3), bench, sizes, PLATFORM.link, "ring", json_path=str(out), say=said.append,
                        measure=_measure([]))
    record = json.loads(out.read_text())
    assert (record["ranks"], record["framework"], record["reps"], record["gradients_of"]) == (3, "tensorflow", 2, None)
    assert record["link"]["bandwidth"] == 1.25e9 and len(record["load_average"]) == 2
    ps = record["measurements"][0]     # over 3 ranks Paleo's OneToAll and FireCaffe's Eq. 3 differ: the first counts
    assert ps["algorithm"] == "ps" and ps["predicted_s"] == ps["predicted_by_model"]["ps"]
    assert ps["predicted_by_model"]["firecaffe-ps"] < ps["predicted_s"]
    assert set(ps["predicted_by_model"]) == {"ps", "firecaffe-ps"}
    assert [p["bytes"] for p in record["horovod_vs_mpi"]] == [1000] and record["torch_vs_mpi"] == []
    assert said[0] == "3 ranks, 2 repetitions; times are the slowest rank's"
    assert sum("Horovod % of MPI rate" in line for line in said) == 1


def test_the_tables_first_line_says_what_was_summed_and_after_what_step():
    sizes = BenchSizes((4000,), (600, 400), (8, 8, 1), "lenet_same")
    grouped = [(AllreduceMeasurement("horovod", 2, 4000, [1e-4], tensors=2), {})]
    lines = table_lines(2, AllreduceBench("tensorflow", ("horovod",), 1, 5.0), sizes, grouped,
                        {"HOROVOD_CYCLE_TIME": "1"}, (0.5, 0.75))
    assert lines[0] == ("2 ranks, 1 repetitions; times are the slowest rank's; Horovod sums lenet_same's 2 gradients "
                        "and the loss as one group, after a 5 ms step (the ranks' mean step subtracted)")
    assert lines[1].startswith("load average 0.50 before, 0.75 after (1 min) on ")
    assert lines[1].endswith("; Horovod knobs: HOROVOD_CYCLE_TIME=1")
    assert lines[3].split() == ["horovod", "2", "0.004", "0.100", "0.100", "-", "-", "-"]   # no link: no model
    torch = [(AllreduceMeasurement("torch", 2, 4000, [1e-4], tensors=2, process_group="gloo"), {})]
    lines = table_lines(2, AllreduceBench("pytorch", ("torch",), 1), sizes, torch, {}, (0.5, 0.75))
    assert "; torch.distributed sums lenet_same's 2 gradients" in lines[0] and lines[1].endswith("framework pytorch")
