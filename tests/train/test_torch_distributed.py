"""The PyTorch backend's ranks: their places from each launcher's variables, the rendezvous, the process group each
launcher's ranks take, and the sums of Gloo and of the MPI group on real ranks (two mpirun jobs over Gloo, one
Slurm step without MPI, and one mpirun job on the MPI group that auto takes there, all started at once)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from firescale.cluster.collectives import resolve_process_group
from firescale.errors import FirescaleError
from firescale.train.torch import distributed, rendezvous
from firescale.train.torch.distributed import (
    FlatSum,
    GradientBuckets,
    Rank,
    choose_process_group,
    describe_allreduce,
    init_rank,
    plan_buckets,
    summed_gradients,
    versions,
)
from firescale.train.torch.rendezvous import (
    Place,
    expand_counts,
    expand_nodelist,
    launcher_place,
    mpi_started,
    slurm_port,
)
from mpitools import mpirun_argv

pytestmark = [pytest.mark.pytorch]

SCRIPT = Path(__file__).parent / "data" / "torch_ranks.py"
ENV = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1"}
# Variables of launchers that a test's own environment must not pass on to ranks that another launcher starts.
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "ALPS_", "MPI_LOCAL")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
KEYS = {"requested", "controller", "cpu_operations", "device", "ompi_coll_tuned", "nccl_algo", "horovod_knobs", "ranks",
        "library", "message_bytes", "algorithm", "model", "tree", "overlap", "collectives", "process_group",
        "bucket_bytes"}


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}


# --- where a rank stands --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({}, Place(0, 1, 0, 1, "none")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, Place(5, 8, 1, 4, "openmpi")),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, Place(3, 4, 1, 2, "mpich")),
    ({"ALPS_APP_PE": "7", "PMI_SIZE": "12"}, Place(7, 12, None, None, "aprun")),
    ({"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
      "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_ID": "0"}, Place(6, 7, 0, 1, "slurm")),
    ({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "7", "SLURM_NTASKS": "99", "SLURM_LOCALID": "1",
      "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_TASKS_PER_NODE": "99",
      "SLURM_STEPID": "2"}, Place(3, 7, 1, 2, "slurm")),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
      "SLURM_STEP_ID": "0"}, Place(1, 2, 1, 2, "slurm")),
    # the batch script's own variables (no step): one process on its own, as Open MPI starts a singleton
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "4"},
     Place(0, 1, 0, 1, "none")),
    # torchrun inside an srun step: the innermost launcher wins
    ({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "SLURM_PROCID": "1",
      "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1",
      "SLURM_STEP_ID": "0"}, Place(9, 16, 1, 8, "torchrun")),
])
def test_each_launcher_s_variables_give_the_rank_s_place(env, expected):
    assert launcher_place(env) == expected


def test_slurm_s_compressed_task_counts_expand_node_by_node():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    assert expand_counts("1,3(x2)") == [1, 3, 3]
    with pytest.raises(ValueError):
        expand_counts("2x3")


@pytest.mark.parametrize(("env", "sentence"), [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
     "the launcher's variable OMPI_COMM_WORLD_RANK is '2', but it must be a whole number from 0 to 1 "
     "(under OMPI_COMM_WORLD_SIZE=2)"),
    ({"PMI_RANK": "one", "PMI_SIZE": "4"},
     "the launcher's variable PMI_RANK is 'one', but it must be a whole number from 0 to 3 (under PMI_SIZE=4)"),
    ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
     "the launcher's variable WORLD_SIZE is '0', but it must be a whole number of at least 1"),
    ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"},
     "the launcher's variable LOCAL_WORLD_SIZE is '8', but it must be a whole number from 1 to 4 (at most "
     "WORLD_SIZE=4)"),
    ({"ALPS_APP_PE": "0"}, "the launcher set ALPS_APP_PE but not PMI_SIZE; an MPICH or Cray MPICH rank needs both"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "the launcher's variable OMPI_COMM_WORLD_SIZE is unset, but it must be a whole "
                                    "number of at least 1"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK and WORLD_SIZE are set but LOCAL_RANK or LOCAL_WORLD_SIZE is not; "
                                       "torchrun sets all four, and ranks started otherwise need them too"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "7", "SLURM_LOCALID": "2", "SLURM_NODEID": "0",
      "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_ID": "0"},
     "the launcher's variable SLURM_LOCALID is '2', but it must be a whole number from 0 to 1 (under this node's 2 "
     "tasks in SLURM_TASKS_PER_NODE)"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "4",
      "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_ID": "0"},
     "the launcher's variable SLURM_NODEID is '4', but it must be a whole number from 0 to 3 (one of the 4 nodes of "
     "SLURM_TASKS_PER_NODE)"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(3)",
      "SLURM_STEP_ID": "0"},
     "the launcher's variable SLURM_TASKS_PER_NODE is '2(3)', but it must be Slurm's task counts per node, such as "
     "4 or 2(x3),1"),
])
def test_a_launcher_s_bad_value_is_one_sentence_naming_the_variable(env, sentence):
    with pytest.raises(FirescaleError) as e:
        launcher_place(env)
    assert str(e.value) == sentence


def test_a_slurm_node_list_expands_to_its_hosts(monkeypatch):
    assert expand_nodelist("n[1-3],m5") == ["n1", "n2", "n3", "m5"]
    assert expand_nodelist("gpu[08-10,12]-ib") == ["gpu08-ib", "gpu09-ib", "gpu10-ib", "gpu12-ib"]
    assert expand_nodelist("r[1-2]n[1-2],login") == ["r1n1", "r1n2", "r2n1", "r2n2", "login"]
    monkeypatch.setattr(rendezvous.shutil, "which", lambda name: None)
    assert rendezvous.first_host("node[007-009]") == "node007"
    monkeypatch.setattr(rendezvous.shutil, "which", lambda name: "/usr/bin/scontrol")
    ran = []

    def scontrol(argv, **kwargs):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="alpha\nbeta\n")

    assert rendezvous.first_host("a[1-2]", run=scontrol) == "alpha"
    assert ran == [["/usr/bin/scontrol", "show", "hostnames", "a[1-2]"]]


def test_a_slurm_step_s_port_follows_its_job_and_step():
    one = slurm_port({"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0"})
    assert one == 20000 + 3456
    assert slurm_port({"SLURM_JOB_ID": "123457", "SLURM_STEP_ID": "0"}) == one + 1
    assert slurm_port({"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "1"}) == one + 1009
    assert all(20000 <= slurm_port({"SLURM_JOB_ID": str(j), "SLURM_STEP_ID": str(s)}) < 30000
               for j in (0, 9999, 10**9 + 7) for s in (0, 5, 99))


def test_ranks_without_mpi_or_a_node_list_are_told_how_to_meet():
    torchless = Place(1, 2, 1, 2, "slurm")
    with pytest.raises(FirescaleError, match="neither MPI nor a Slurm node list.*set MASTER_ADDR and MASTER_PORT"):
        rendezvous.rendezvous(torchless, {}, timedelta(seconds=1))
    with pytest.raises(FirescaleError, match="MASTER_PORT is 'http', but it must be a TCP port from 1 to 65535"):
        rendezvous.rendezvous(torchless, {"MASTER_PORT": "http"}, timedelta(seconds=1))
    with pytest.raises(FirescaleError, match="rank 0 runs on n7, not on n1, the first node of the step's node list"):
        rendezvous.rendezvous(Place(0, 2, 0, 1, "slurm"), {"SLURM_STEP_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n7"},
                              timedelta(seconds=1))


def test_rank_0_on_a_taken_port_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with pytest.raises(FirescaleError, match=f"rank 0 cannot listen on TCP port {port} .*set MASTER_PORT"):
            rendezvous.rendezvous(Place(0, 2, 0, 2, "slurm"), env, timedelta(seconds=5))


# --- one rank, and what needs no ranks ------------------------------------------------------------------------


@pytest.fixture
def alone(monkeypatch):
    """This process as a one-rank job: no launcher's variables, no pinning of the test's own process."""
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in LAUNCHER_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("FIRESCALE_PIN_CPUS", "0")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_nccl_on_a_node_without_a_gpu_is_one_sentence(alone, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(FirescaleError) as e:
        init_rank(process_group="nccl")
    assert str(e.value) == ("NCCL needs a CUDA GPU on every rank, and this node has none; use mpi or gloo, or a GPU "
                            "site")
    with pytest.raises(FirescaleError, match="devices is 2, but the PyTorch backend runs one device per rank"):
        init_rank(devices=2)
    with pytest.raises(FirescaleError, match="process group 'ucc' is not known; known: auto, gloo, mpi, nccl"):
        init_rank(process_group="ucc")


def test_auto_is_nccl_on_gpus_mpi_on_cpu_ranks_mpi_started_and_gloo_otherwise():
    assert resolve_process_group("auto", gpu=True, mpi_ranks=True) == "nccl"
    assert resolve_process_group("auto", gpu=False, mpi_ranks=True) == "mpi"
    assert resolve_process_group("auto", gpu=False, mpi_ranks=False) == "gloo"
    assert resolve_process_group("gloo", gpu=False, mpi_ranks=True) == "gloo"   # a named group is itself
    two = Place(0, 2, 0, 2, "slurm")
    assert not mpi_started(two, {}) and mpi_started(two, {"PMIX_RANK": "0"})   # srun --mpi=pmix
    assert mpi_started(Place(0, 2, 0, 2, "openmpi"), {}) and mpi_started(Place(0, 2, None, None, "aprun"), {})
    assert not mpi_started(Place(0, 2, 0, 2, "torchrun"), {"PMIX_RANK": "0"})   # the innermost launcher's
    # no MPI started these ranks: auto takes Gloo without asking MPI
    assert choose_process_group("auto", False, two, {}) == "gloo"
    assert choose_process_group("auto", True, two, {"PMIX_RANK": "0"}) == "nccl"
    with pytest.raises(FirescaleError) as e:
        choose_process_group("mpi", True, two, {})
    assert str(e.value) == ("the MPI process group sums CPU tensors, and this rank trains on a GPU; use nccl (or "
                            "auto) on GPUs")


def test_one_rank_has_no_process_group_and_sums_nothing(alone):
    rank = init_rank(threads=1)
    assert (rank.rank, rank.size, rank.local_rank, rank.local_size) == (0, 1, 0, 1)
    assert rank.process_group == "none" and rank.rendezvous == "" and not dist.is_initialized()
    assert rank.is_root and rank.devices == () and torch.get_num_threads() == 1
    t = [torch.ones(3), torch.zeros(2, dtype=torch.int64)]
    assert all(a is b for a, b in zip(rank.sum(t), t))
    np.testing.assert_array_equal(rank.sum_numbers([1, 2.5]), np.array([1.0, 2.5]))
    assert rank.sum_numbers([1]).dtype == np.float64
    assert rank.broadcast_object({"a": 1}) == {"a": 1} and rank.gather_object(3) == [3]
    rank.broadcast_tensors(t)
    rank.barrier()
    net = torch.nn.Linear(3, 2)
    buckets = GradientBuckets(rank, net.parameters(), bucket_bytes=8)
    net(torch.ones(4, 3)).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(buckets.wait(), net.parameters()))
    assert all(a is p.grad for a, p in zip(summed_gradients(rank, list(net.parameters())), net.parameters()))
    record = describe_allreduce(rank, {}, gradient_bytes=32)
    assert set(record.to_dict()) == KEYS
    assert (record.library, record.algorithm, record.model, record.process_group) == (
        "none", "none (one rank)", None, "none")
    shown = versions(rank)
    assert set(shown) == {"firescale", "python", "numpy", "torch", "cuda", "cudnn", "nccl", "process_group", "mpi",
                          "mpi_library", "hostname"}
    assert shown["torch"] == torch.__version__ and shown["process_group"] == "none" and shown["mpi_library"] is None
    assert (shown["mpi"] is None) == (shutil.which("mpirun") is None)
    rank.close()


def test_a_flat_sum_takes_blobs_of_one_dtype_on_one_device_only():
    assert FlatSum.fits([torch.zeros(2), torch.zeros(3, 1)])
    assert not FlatSum.fits([]) and not FlatSum.fits([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    alone = FlatSum(Rank(0, 1, 0, 1, "cpu", [], "none"), [torch.zeros(2), torch.zeros(1, 1)])
    views, pair = alone([torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])], torch.tensor(4.0), torch.tensor(0.0))
    assert [v.tolist() for v in views] == [[1.0, 2.0], [[3.0]]] and pair.tolist() == [4.0, 0.0]   # one rank: as given
    with pytest.raises(FirescaleError, match="one dtype on one device"):
        FlatSum(Rank(0, 1, 0, 1, "cpu", [], "none"), [torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)])


def test_buckets_hold_one_dtype_last_parameter_first_and_close_before_the_bucket_size():
    params = [torch.zeros(10), torch.zeros(2), torch.zeros(2), torch.zeros(3, dtype=torch.float64), torch.zeros(1)]
    # 40, 8, 8, 24, 4 bytes; from the last: [4] then float64 [24], then [8 + 8], then 40 alone (over 20)
    assert plan_buckets(params, 20) == [[4], [3], [2, 1], [0]]
    assert plan_buckets(params, 10**6) == [[4], [3], [2, 1, 0]]
    with pytest.raises(FirescaleError, match="bucket_bytes is 0"):
        GradientBuckets(Rank(0, 1, 0, 1, "cpu", [], "none"), params, bucket_bytes=0)


def test_the_record_of_a_gpu_site_s_allreduce_reads_nccl_algo():
    rank = Rank(0, 8, 0, 4, "cuda:0", [], "nccl")
    env = {"FIRESCALE_ALLREDUCE": "tree", "NCCL_ALGO": "Tree", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}
    grouped = describe_allreduce(rank, env, gradient_bytes=100 * 2**20)
    shown = grouped.to_dict()
    assert set(shown) == KEYS
    assert {k: shown[k] for k in ("requested", "controller", "cpu_operations", "nccl_algo", "library", "algorithm",
                                    "model", "tree", "overlap", "message_bytes", "bucket_bytes", "horovod_knobs")} == {
        "requested": "tree", "controller": "torch.distributed", "cpu_operations": "none", "nccl_algo": "Tree",
        "library": "nccl", "algorithm": "nccl tree", "model": "tree", "tree": True, "overlap": False,
        "message_bytes": 100 * 2**20, "bucket_bytes": None, "horovod_knobs": {}}
    assert grouped.ompi_coll_tuned == {"coll_tuned_use_dynamic_rules": "1"}
    assert grouped.collectives["library"] == "NCCL" and grouped.collectives["gpu_operations"] == "NCCL"
    overlapped = describe_allreduce(rank, env, gradient_bytes=100 * 2**20, overlap=True)
    # the registry's default bucket, DistributedDataParallel's 25 MiB
    assert overlapped.bucket_bytes == distributed.default_bucket_bytes() == 25 * 2**20 == overlapped.message_bytes


# --- real ranks ------------------------------------------------------------------------------------------------


def _free_slurm_job() -> str:
    """A job id whose step 0 port (slurm_port) nothing on this machine holds now."""
    for offset in range(200):
        job = str(100000 + (os.getpid() * 7 + offset) % 10000)
        with socket.socket() as probe:
            try:
                probe.bind(("", slurm_port({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"})))
                return job
            except OSError:
                continue
    raise AssertionError("no free port among 200 Slurm job ids")


@pytest.fixture(scope="module")
def slurm_job() -> str:
    return _free_slurm_job()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, slurm_job) -> dict[str, list[dict]]:
    """Four 2-rank jobs started at once on this machine, each rank running data/torch_ranks.py: two under mpirun
    over Gloo (--process-group gloo: they meet through MPI on ports the kernel picks), one as an srun step's tasks
    without MPI (auto: Gloo; they meet on the first host of the node list and the job's port), and one under
    mpirun on the process group auto takes there, MPI's."""
    root = tmp_path_factory.mktemp("torch-ranks")
    host, job = socket.gethostname(), slurm_job
    started = {}
    for name, group in (("mpi-a", "gloo"), ("mpi-b", "gloo"), ("mpi", "auto")):
        (root / name).mkdir()
        argv = mpirun_argv(2, [sys.executable, str(SCRIPT), str(root / name), group], ENV)
        started[name] = subprocess.Popen(argv, env={**os.environ, **ENV}, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    (root / "slurm").mkdir()
    for r in range(2):
        step = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),
                "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURM_STEP_NODELIST": host, "SLURMD_NODENAME": host}
        started[f"slurm-{r}"] = subprocess.Popen([sys.executable, str(SCRIPT), str(root / "slurm")],
                                                 env={**_plain_env(), **ENV, **step}, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)
    failed = []
    for name, proc in started.items():
        try:
            output, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        if proc.returncode != 0 or "finalize" in output.lower():
            failed.append(f"--- {name} exited {proc.returncode}\n{output[-3000:]}")
    assert not failed, "\n".join(failed)
    return {name: [json.loads((root / name / f"rank-{r}.json").read_text()) for r in range(2)]
            for name in ("mpi-a", "mpi-b", "slurm", "mpi")}


GLOO_JOBS = ("mpi-a", "mpi-b", "slurm")


@pytest.mark.mpi
def test_two_jobs_at_once_meet_on_ports_of_their_own(jobs, slurm_job):
    met = {name: {report["rendezvous"] for report in jobs[name]} for name in GLOO_JOBS}
    assert all(len(places) == 1 for places in met.values()), met
    a, b, slurm = (places.pop() for places in met.values())
    assert a.startswith("127.0.0.1:") and b.startswith("127.0.0.1:") and a != b   # all ranks on one host
    assert slurm == f"{socket.gethostname()}:{slurm_port({'SLURM_JOB_ID': slurm_job, 'SLURM_STEP_ID': '0'})}"
    for name, reports in jobs.items():
        places = [(r["rank"], r["size"], r["local_rank"], r["local_size"]) for r in reports]
        assert places == [(0, 2, 0, 2), (1, 2, 1, 2)]
        group = "mpi" if name == "mpi" else "gloo"
        assert {(r["device"], r["process_group"]) for r in reports} == {("cpu", group)}
    assert {r["rendezvous"] for r in jobs["mpi"]} == {""}   # MPI's own communicator: no TCP store


@pytest.mark.mpi
def test_one_grouped_sum_of_several_dtypes_and_shapes_is_the_sum_by_hand(jobs):
    # rank r adds r+1 everywhere, arange(5) * (r+1), 0.25 * (r+1), 10**r, and 7r as a 0-d int32
    expected = [["float32", [2, 3], [3.0] * 6], ["int64", [5], [0, 3, 6, 9, 12]], ["float64", [1], [0.75]],
                ["float32", [4], [11.0] * 4], ["int32", [], [7]]]
    for reports in jobs.values():
        for report in reports:
            assert report["collectives"]["sum"] == expected
            assert report["collectives"]["inputs_kept"]
            assert report["collectives"]["numbers"] == [2.0, 1.0, 2.0**41 + 1]   # exact in float64


@pytest.mark.mpi
def test_rank_0_s_tensors_and_objects_reach_every_rank(jobs):
    for reports in jobs.values():
        for report in reports:
            seen = report["collectives"]
            assert seen["broadcast_tensors"] == [["float32", [3], [0.0] * 3], ["int32", [2, 2], [10] * 4]]
            assert seen["broadcast_object"] == {"from": 0, "list": [0, 0, 0]}
            assert seen["gather_object"] == [["rank", 0], ["rank", 1]]


@pytest.mark.mpi
def test_buckets_summed_during_backward_equal_the_grouped_sum_after_it(jobs):
    for reports in jobs.values():
        for report in reports:
            buckets = report["buckets"]
            assert len(buckets["buckets"]) == 4 and buckets["buckets"][-1] == [0]   # the unused parameter's last
            for step in buckets["steps"]:
                # the three buckets before the unused parameter's start while backward runs
                assert step["started_in_backward"] == 3
                assert step["overlapped_equals_grouped"] and step["overlapped_equals_by_hand"]
                assert step["shapes_kept"] and step["unused"] == [0.0, 0.0]
        firsts = [[step["first"] for step in report["buckets"]["steps"]] for report in reports]
        assert firsts[0] == firsts[1] and firsts[0][0] != firsts[0][1]   # one sum on both ranks, a new one each step


@pytest.mark.mpi
def test_the_trainer_s_sum_through_one_buffer_is_the_sum_by_hand_in_its_slots(jobs):
    for reports in jobs.values():
        for report in reports:
            flat = report["flat_sum"]
            for step in flat["steps"]:
                assert step["equals_by_hand"] and step["inputs_kept"] and step["in_the_buffer"]
                assert step["shapes_kept"] == [[2, 3], [4], [1, 1, 2]]
            # each sum's (loss, flag) is its own: the second sum did not write over the first's
            assert flat["pairs"] == [[2.0, 0.0], [4.0, 1.0]]


@pytest.mark.mpi
def test_the_mpi_group_s_sums_are_gloo_s_to_the_bit(jobs):
    """Two ranks' float32 sums are a + b whichever library adds them: the MPI group's gradient buckets equal Gloo's
    on the same data exactly; bfloat16 (summed by MPI in a float32 copy) rounds as Gloo's bf16 sum does."""
    for mpi, gloo in zip(jobs["mpi"], jobs["mpi-a"]):
        assert [s["first"] for s in mpi["buckets"]["steps"]] == [s["first"] for s in gloo["buckets"]["steps"]]
        assert mpi["collectives"]["bf16"] == gloo["collectives"]["bf16"]
        # 1 + 2**-8 is halfway between bf16's 1 and 1 + 2**-7: it rounds to even, 1
        assert mpi["collectives"]["bf16"]["sum"] == ["bfloat16", [4], [2.0, 1.0, 9.0, 0.30078125]]
        assert mpi["collectives"]["bf16"]["float32_beside"] == ["float32", [2], [2.0, 2.0]]
        assert mpi["collectives"]["bf16"]["broadcast"] == ["bfloat16", [3], [0.5] * 3]


@pytest.mark.mpi
def test_the_mpi_group_records_mpi_and_its_library(jobs):
    for report in jobs["mpi"]:
        record = report["allreduce"]
        assert set(record) == KEYS
        assert {k: record[k] for k in ("controller", "cpu_operations", "library", "algorithm", "model", "ranks",
                                       "message_bytes", "process_group")} == {
            "controller": "mpi4py", "cpu_operations": "mpi", "library": "openmpi",
            "algorithm": "mpi recursive_doubling (Open MPI's fixed rules for 1000 bytes over 2 ranks)",
            "model": "butterfly", "ranks": 2, "message_bytes": 1000, "process_group": "mpi"}
        assert record["collectives"]["library"] == "MPI"
        shown = report["versions"]
        assert shown["process_group"] == "mpi" and shown["mpi_library"].startswith("Open MPI v")
    for report in jobs["mpi-a"]:
        assert report["versions"]["process_group"] == "gloo" and report["versions"]["mpi_library"] is None


@pytest.mark.mpi
def test_two_ranks_record_gloo_s_ring(jobs):
    for reports in (jobs[name] for name in GLOO_JOBS):
        for report in reports:
            record = report["allreduce"]
            assert set(record) == KEYS
            assert {k: record[k] for k in ("controller", "cpu_operations", "library", "algorithm", "model", "ranks",
                                           "message_bytes", "bucket_bytes", "overlap", "process_group")} == {
                "controller": "torch.distributed", "cpu_operations": "gloo", "library": "gloo",
                "algorithm": "gloo ring", "model": "ring", "ranks": 2, "message_bytes": 1000, "bucket_bytes": 1000,
                "overlap": True, "process_group": "gloo"}
            assert record["collectives"]["library"] == "Gloo"
