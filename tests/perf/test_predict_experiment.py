"""`firescale predict experiment`: every sweep point of an experiment on a site, in the JSON the workflow reads."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest
import yaml

from cli import run_firescale
from firescale.data.batch import batches_per_read
from firescale.errors import FirescaleError
from firescale.predict.calibrate import Calibration, save_calibration
from firescale.predict.experiment import ILSVRC12_TRAIN_IMAGES


@cache
def digits_split() -> tuple[int, int]:
    """The training and test records of `data ingest --source digits`, counted from scikit-learn's digits
    (1,797 images of 10 classes) by the ingest's rule: the default test fraction 0.2 of each class, rounded
    (data/sources.py, stratified_split); 1,438 and 359."""
    from sklearn.datasets import load_digits

    per_class = [int(n) for n in np.bincount(load_digits().target)]
    test = sum(round(0.2 * n) for n in per_class)
    return sum(per_class) - test, test


@pytest.fixture(scope="module")
def digits_config(repo, tmp_path_factory):
    """workflow/config.yaml with the tests' digits-lenet experiment (tests/workflow/digits-lenet.yaml) added."""
    config = yaml.safe_load((repo / "workflow" / "config.yaml").read_text())
    extra = yaml.safe_load((repo / "tests" / "workflow" / "digits-lenet.yaml").read_text())
    config["experiments"].update(extra["experiments"])
    for exp in config["experiments"].values():  # the copy lies outside the project: its solvers by full path
        exp["solver"] = str(repo / exp["solver"])
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def local_site(repo, tmp_path_factory):
    """The local site with its datasets in a fresh folder holding a real ingest of digits."""
    root = tmp_path_factory.mktemp("site")
    site = yaml.safe_load((repo / "site" / "local" / "site.yaml").read_text())
    site["paths"] = {k: str(root / k) for k in ("datasets", "scratch", "results")}
    (root / "local").mkdir()
    path = root / "local" / "site.yaml"                     # a site's folder carries its name
    path.write_text(yaml.safe_dump(site))
    proc = run_firescale("data", "ingest", "--source", "digits", "--out", root / "datasets")
    assert proc.returncode == 0, proc.stderr
    return path


def test_digits_lenet_on_local_with_a_calibration(repo, tmp_path, local_site, digits_config):
    cal = tmp_path / "calibration.json"
    save_calibration(cal, Calibration("local", 0.35, 0.8, {"net": "lenet_same"}, {"fitted": False}, overhead_s=0.002,
                                      eval_s=0.05))
    out, md = tmp_path / "predict.json", tmp_path / "predict.md"
    proc = run_firescale("predict", "experiment", local_site, "--experiment", "digits-lenet",
                      "--config", digits_config,
                      "--calibration", cal, "--json", out, "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["site"] == "local" and data["experiment"] == "digits-lenet"
    assert data["calibration"]["overhead_s"] == 0.002 and data["allreduce"] == "tree"
    points = data["points"]
    assert sorted(points) == ["baseline", "g2-b64-r0"]          # the local sweep: 1 and 2 ranks at total 64
    for p in points.values():
        assert set(p) == {"gpus", "batch", "lr", "epochs", "iteration_s", "iterations", "training_s", "evaluation_s",
                          "evaluations", "time_to_accuracy_s", "speedup", "allreduce_model", "memory",
                          "nodes", "comm_s", "comm_intra_s", "comm_inter_s", "io_s", "h2d_s", "batches_per_read"}
        assert p["allreduce_model"] == "tree"                   # local forces Open MPI's binomial tree
        # as many batches a read as the trainer takes (the stall watch counts on it): 32 of 64 or 32 digits
        assert p["batches_per_read"] == batches_per_read(p["batch"] // p["gpus"], (8, 8, 1)) == 32
        assert p["memory"]["fits"] and 0 < max(p["memory"]["peak_bytes"]) < 24e9
    base, two = points["baseline"], points["g2-b64-r0"]
    assert (base["gpus"], base["batch"], two["gpus"], two["batch"]) == (1, 64, 2, 64)
    assert base["speedup"] == 1.0 and 1.0 < two["speedup"] < 2.0
    # No `epochs` key: the baseline's max_iter (1500) at batch 64 over the 1,438 training records.
    model = data["model"]
    train, test = digits_split()
    assert model["dataset_size"] == train and model["input_shape"] == [8, 8, 1]
    assert model["epochs"] == pytest.approx(1500 * 64 / train)
    assert base["training_s"] == pytest.approx(1500 * base["iteration_s"])
    # An evaluation before the first iteration (Caffe's default test_initialization) and every 50
    # iterations (the solver's test_interval): 31 of the calibrated 50 ms on one device, sharded in two
    # at 2 ranks; time to accuracy is training plus evaluating.
    assert model["test_interval"] == 50 and model["test_size"] == test and model["test_initialization"] is True
    assert base["evaluation_s"] == pytest.approx(31 * 0.05) and two["evaluation_s"] == pytest.approx(31 * 0.05 / 2)
    for p in (base, two):
        assert p["time_to_accuracy_s"] == pytest.approx(p["training_s"] + p["evaluation_s"])
    assert two["speedup"] == pytest.approx(base["time_to_accuracy_s"] / two["time_to_accuracy_s"])
    assert base["iteration_s"] > 0.002                        # the overhead is in every iteration
    assert f"| g2-b64-r0 | 2 | 64 | 0.05 | {1500 * 64 / train:.4g} |" in md.read_text()       # 66.76 epochs
    # calibrated: the fitted percents of peak, and no word of peak in the table
    assert data["calibrated"] is True and data["percent_of_peak"] == {
        "compute": 0.35, "compute_source": "calibration", "comm": 0.8, "comm_source": "calibration"}
    assert "calibrated)" in md.read_text() and "ncalibrated" not in md.read_text() + proc.stdout


def test_a_calibration_of_another_site_is_refused(repo, tmp_path, local_site, digits_config):
    cal = tmp_path / "calibration.json"
    save_calibration(cal, Calibration("titan", 0.21, 0.56, {}, {}))
    proc = run_firescale("predict", "experiment", local_site, "--experiment", "digits-lenet",
                      "--config", digits_config,
                      "--calibration", cal, "--json", tmp_path / "p.json")
    assert proc.returncode == 1 and "calibration is for site 'titan'" in proc.stderr
    assert not (tmp_path / "p.json").exists()
    proc = run_firescale("predict", "experiment", local_site, "--experiment", "nin-imagenet",
                      "--json", tmp_path / "p.json")
    assert proc.returncode == 1 and "does not run on site 'local'" in proc.stderr
    proc = run_firescale("predict", "experiment", local_site, "--experiment", "digits-lenet",
                      "--config", digits_config,
                      "--dataset-size", "1000", "--json", tmp_path / "p.json")
    assert proc.returncode == 1 and "disagrees" in proc.stderr


def test_nin_on_titan_without_a_manifest_uses_ilsvrc12(repo, tmp_path):
    out = tmp_path / "titan.json"
    proc = run_firescale("predict", "experiment", "titan", "--experiment", "nin-imagenet",
                      "--ppp-compute", "0.21", "--ppp-comm", "0.56", "--json", out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["calibration"] is None and data["calibrated"] is False
    assert data["percent_of_peak"] == {"compute": 0.21, "compute_source": "given", "comm": 0.56, "comm_source": "given"}
    assert ("compute x 0.21 of peak as given (--ppp-compute) and links x 0.56 of peak as given (--ppp-comm). "
            "For a calibrated prediction give --calibration results/titan/nin-imagenet/calibration.json") in proc.stdout
    # the experiment's own `epochs: 47` (workflow/config.yaml), over ILSVRC-2012's 1,281,167 training images
    assert data["model"]["dataset_size"] == ILSVRC12_TRAIN_IMAGES == 1_281_167 and data["model"]["epochs"] == 47
    points = data["points"]
    names = ["baseline", "g32-b256-r0", "g32-b1024-r0", "g128-b1024-r0"]
    assert sorted(points) == sorted(names)                  # keys are written sorted
    base = points["baseline"]
    assert base["time_to_accuracy_s"] == pytest.approx(
        math.ceil(47 * ILSVRC12_TRAIN_IMAGES / 256) * base["iteration_s"])
    # No manifest, so no test split to count evaluations over: Paleo's training time alone.
    assert all(p["evaluation_s"] == 0 and p["time_to_accuracy_s"] == p["training_s"] for p in points.values())
    # FireCaffe's ordering of speedups (Table 2: 13x, 23x, 39x), from the model.
    speedups = [points[k]["speedup"] for k in names[1:]]
    assert speedups == sorted(speedups) and speedups[0] > 10


def test_an_uncalibrated_prediction_says_that_x_1_is_the_peak_and_where_calibrated_figures_come_from(tmp_path):
    """Titan's NiN with nothing calibrated: the model at the K20X's and Gemini's peak (a 31.88 h baseline, where
    FireCaffe measured 139.2 h), and the text, the Markdown and the JSON say so."""
    out, md = tmp_path / "titan.json", tmp_path / "titan.md"
    proc = run_firescale("predict", "experiment", "titan", "--experiment", "nin-imagenet", "--json", out,
                         "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("titan: 3.935 TFLOP/s x 1,")
    data = json.loads(out.read_text())
    assert data["calibrated"] is False and data["calibration"] is None
    assert data["percent_of_peak"] == {"compute": 1.0, "compute_source": "peak", "comm": 1.0, "comm_source": "peak"}
    assert 31 * 3600 < data["points"]["baseline"]["time_to_accuracy_s"] < 33 * 3600     # at peak: a quarter
    note = md.read_text().splitlines()[2]
    assert note.startswith("**Uncalibrated:** compute x 1 is the device's peak and links x 1 the link's peak; ")
    for words in ("0.21 of the device's, 0.56 of the link's; `firescale predict paleo`",
                  "--calibration results/titan/nin-imagenet/calibration.json", "the workflow's calibration job",
                  "`firescale predict calibrate`"):
        assert words in note, words
    assert note in proc.stdout and ", uncalibrated)" in md.read_text().splitlines()[0]
    # a percent of compute peak given by hand: no longer the peak, still not calibrated; the links still at peak
    proc = run_firescale("predict", "experiment", "titan", "--experiment", "nin-imagenet", "--ppp-compute", "0.21",
                         "--json", out)
    assert json.loads(out.read_text())["percent_of_peak"]["compute_source"] == "given"
    assert "compute x 0.21 of peak as given (--ppp-compute) and links x 1 the link's peak; real runs" in proc.stdout


def test_a_gpu_sites_table_prints_without_a_json_file_and_splits_links_and_reads(repo, tmp_path):
    """A user's first look at a GPU site: the table alone on stdout (nothing written), with ib-cluster's NVLink
    inside a node and its reads and host-to-device copies in each point."""
    proc = run_firescale("predict", "experiment", repo / "site" / "ib-cluster" / "site.yaml", "--experiment",
                         "nin-imagenet", "--config", repo / "workflow" / "config.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| g") or line.startswith("| baseline")}
    intra, inter = (float(x) for x in rows["g4-b256-r0"][5].split(" + "))
    assert intra > 0 and inter == 0                                # one node of 4 GPUs: NVLink only
    intra16, inter16 = (float(x) for x in rows["g16-b256-r0"][5].split(" + "))
    assert intra16 == intra and inter16 > intra                    # 4 nodes: InfiniBand, slower than NVLink
    io, h2d = (float(x) for x in rows["baseline"][6].split(" + "))
    assert io > 0 and h2d > 0


def test_epochs_to_target_come_from_the_baselines_own_evaluations(tmp_path):
    from firescale.predict.experiment import baseline_epochs_to_target

    record = tmp_path / "baseline.json"
    evals = [{"epoch": 2.0, "top1": 0.80}, {"epoch": 4.0, "top1": 0.93}, {"epoch": 8.0, "top1": 0.95}]
    record.write_text(json.dumps({"outcome": "succeeded", "train": {"evals": evals}}))
    assert baseline_epochs_to_target(record, 0.02)[0] == 4.0            # 0.95 - 0.02 = 0.93, reached at 4
    assert baseline_epochs_to_target(record, 0.0)[0] == 8.0
    assert baseline_epochs_to_target(record, 0.5, accuracy=0.75)[0] == 2.0
    record.write_text(json.dumps({"outcome": "failed", "train": None}))
    with pytest.raises(FirescaleError, match="the baseline has no evaluations"):
        baseline_epochs_to_target(record, 0.02)


def test_without_a_measured_evaluation_the_forward_pass_over_the_test_set_is_modelled(repo, tmp_path, local_site):
    from firescale.cluster.site import load_site
    from firescale.model.layers import net_cost
    from firescale.model.paleo import compute_times, platform_from_site
    from firescale.nets.zoo import get_net
    from firescale.predict.experiment import ExperimentModel, evaluation_s

    platform = platform_from_site(load_site(local_site))
    train, test = digits_split()
    model = ExperimentModel(get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)), train, "test", 4.0, "test",
                            test_interval=50, test_size=test)
    forward = compute_times(net_cost(model.net, -(-test // 2)), platform.device).forward    # 180 per device
    assert evaluation_s(model, platform, 2, 101) == pytest.approx(3 * forward)       # at 50, 100 and the end
    cal = Calibration("local", 0.5, 0.5, {}, {}, eval_s=0.04)
    assert evaluation_s(model, platform, 2, 100, cal) == pytest.approx(2 * 0.02)
    no_test = ExperimentModel(model.net, train, "test", 4.0, "test", test_interval=50, test_size=0)
    assert evaluation_s(no_test, platform, 1, 100, cal) == 0.0
    # Ranks that share a node evaluate their shards at once, as they train: the node's contention slows both.
    shared = replace(platform, contention=2.1)
    assert evaluation_s(model, shared, 2, 100, cal) == pytest.approx(2 * 0.02 * 2.1)
    assert evaluation_s(model, shared, 2, 101) == pytest.approx(3 * forward * 2.1)
    assert evaluation_s(model, shared, 1, 100, cal) == pytest.approx(2 * 0.04)        # one device: alone


@pytest.mark.parametrize("site", ["titan", "ib-cluster"])
def test_googlenet_table3_predicts_on_titan_and_the_ib_cluster(repo, tmp_path, site):
    out = tmp_path / "googlenet.json"
    proc = run_firescale("predict", "experiment", site, "--experiment", "googlenet-imagenet", "--json", out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    points = data["points"]
    assert data["model"]["epochs"] == 64 and points["baseline"]["batch"] == 32
    search = [f"g32-b1024-lr{lr}-r0" for lr in ("0.02", "0.04", "0.08", "0.16", "0.32")]
    assert set(search) < set(points) and "g128-b1024-lr0.08-r0" in points
    big = points["g32-b1024-lr0.08-r0"]
    assert big["epochs"] == pytest.approx(72) and big["lr"] == 0.08     # Table 3: 72 epochs at batch 1024
    assert big["iterations"] == math.ceil(72 * ILSVRC12_TRAIN_IMAGES / 1024)
    assert 1 < big["speedup"] < points["g128-b1024-lr0.08-r0"]["speedup"] < 128
def test_a_site_left_to_its_library_predicts_what_the_library_picks(tmp_path, local_site):
    """allreduce: default on an Open MPI site: each point is modelled with the algorithm Open MPI's fixed
    rules pick for that point's gradient and rank count, and the prediction records which."""
    from firescale.cluster.collectives import openmpi_default_allreduce
    from firescale.cluster.site import load_site
    from firescale.model.layers import net_cost
    from firescale.model.paleo import platform_from_site, predict_point
    from firescale.nets.zoo import get_net

    site = yaml.safe_load(local_site.read_text())
    site["allreduce"] = {"algorithm": "default"}
    path = tmp_path / "local" / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(site))
    platform = platform_from_site(load_site(path))
    assert platform.algorithm == "openmpi-default"
    net = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    nbytes = net_cost(net, 1).weight_bytes
    picked = openmpi_default_allreduce(2, nbytes)
    expected = {"ring": "ring", "segmented_ring": "ring", "rabenseifner": "rabenseifner",
                "recursive_doubling": "butterfly"}[picked]
    two = predict_point(platform, net, 2, 64)
    assert two.algorithm == "openmpi-default" and two.comm_algorithm == expected
    assert two.comm_s == predict_point(platform, net, 2, 64, algorithm=expected).comm_s


def test_a_read_bandwidth_from_bench_io_gives_t_io_unless_the_site_gives_one(tmp_path, local_site, digits_config,
                                                                              capsys):
    """`bench io` on the ingested digits -> `predict calibrate --io-record` -> `predict experiment`: each
    point's t_io is its node's batch bytes over the stored bandwidth; a site's storage.read_gbytes_per_s wins."""
    from dataclasses import replace
    from pathlib import Path

    from firescale.cli import main
    from firescale.model.io_time import DataPath
    from firescale.model.paleo import platform_from_site
    from firescale.predict.calibrate import load_calibration
    from firescale.predict.experiment import predict_experiment
    from firescale.sweep.plan import load_plan

    dataset = Path(yaml.safe_load(local_site.read_text())["paths"]["datasets"]) / "digits"
    bench = tmp_path / "bench-io.json"
    assert main(["bench", "io", "--dataset", str(dataset), "--batch", "16", "--seconds", "0.05", "--no-wait",
                 "--json", str(bench)]) == 0
    record = json.loads(bench.read_text())
    measured = record["readers"]["lmdb"]["raw_sequential"]["MB_per_s"] * 1e6   # the trainer reads LMDB
    cal_path = tmp_path / "calibration.json"
    net = yaml.safe_load(digits_config.read_text())["experiments"]["digits-lenet"]["net"]
    assert main(["predict", "calibrate", "--site", str(local_site), "--net", net, "--input", "8,8,1",
                 "--classes", "10", "--batch", "64", "--iteration-s", "0.01", "--io-record", str(bench),
                 "--out", str(cal_path)]) == 0
    assert "stored as one node's read bandwidth" in capsys.readouterr().out
    stored = json.loads(cal_path.read_text())
    assert stored["read_bandwidth"] == measured > 0
    assert {k: stored["io_source"][k] for k in ("source", "dataset", "format", "batch", "measured_at")} == {
        "source": str(bench), "dataset": str(dataset), "format": "lmdb", "batch": 16,
        "measured_at": record["measured_at"]}

    def predict(site: Path, name: str) -> dict:
        out = tmp_path / f"{name}.json"
        assert main(["predict", "experiment", str(site), "--experiment", "digits-lenet", "--config",
                     str(digits_config), "--calibration", str(cal_path), "--json", str(out)]) == 0
        return json.loads(out.read_text())

    def expected_io(result: dict, bandwidth: float) -> dict:
        """Eq. 6 by hand: the ranks of one node each read their batch of 8x8x1 stored bytes, at the node's rate."""
        per_node = result["model"]["platform"]["ranks_per_node"]
        return {name: pytest.approx(min(p["gpus"], per_node) * (p["batch"] // p["gpus"]) * 64 / bandwidth,
                                    rel=1e-12) for name, p in result["points"].items()}

    calibrated = predict(local_site, "calibrated")
    assert calibrated["model"]["platform"]["read_bandwidth_source"] == "calibration"
    assert calibrated["model"]["platform"]["read_bandwidth"] == measured
    assert {n: p["io_s"] for n, p in calibrated["points"].items()} == expected_io(calibrated, measured)
    assert f"read {measured / 1e9:.4g} GB/s a node from the calibration" in capsys.readouterr().out
    # local's ranks read in line with their step, so t_io adds to the iteration.
    plan = load_plan(local_site, digits_config)
    without = predict_experiment(plan, "digits-lenet", calibration=replace(load_calibration(cal_path),
                                                                           read_bandwidth=0.0))
    assert without["model"]["platform"]["read_bandwidth_source"] is None
    for name, p in calibrated["points"].items():
        assert without["points"][name]["io_s"] == 0.0
        assert p["iteration_s"] - without["points"][name]["iteration_s"] == pytest.approx(p["io_s"], rel=1e-6)

    site = yaml.safe_load(local_site.read_text())
    site["storage"] = {"read_gbytes_per_s": 0.5}
    (tmp_path / "local").mkdir()
    with_storage = tmp_path / "local" / "site.yaml"
    with_storage.write_text(yaml.safe_dump(site))
    sited = predict(with_storage, "sited")
    assert sited["model"]["platform"]["read_bandwidth_source"] == "site"
    assert {n: p["io_s"] for n, p in sited["points"].items()} == expected_io(sited, 0.5e9)
    # the source travels with the bandwidth, not guessed from its value: a caller's own platform that happens
    # to read at the site's rate is the caller's
    sited_plan = load_plan(with_storage, digits_config)
    own = platform_from_site(sited_plan.site)
    own = replace(own, data=DataPath(own.data.read_bandwidth, overlap_io=own.data.overlap_io))
    assert own.data.read_bandwidth == 0.5e9
    given = predict_experiment(sited_plan, "digits-lenet", platform=own)
    assert given["model"]["platform"]["read_bandwidth_source"] == "platform"


@pytest.mark.parametrize("record, says", [
    ({"format": "firescale.bench.allreduce/1", "measurements": []}, "not a `firescale bench io --json` record "
                                                                     "(no key 'dataset')"),
    ([1, 2], "not a `firescale bench io --json` record"),
    ({"dataset": "d", "batch": 8, "readers": {"lmdb": {"shuffled": {"MB_per_s": 9.0}}}},
     "no key 'readers.lmdb.raw_sequential.MB_per_s'"),
    ({"dataset": "d", "batch": 8, "readers": {"lmdb": {"raw_sequential": {"MB_per_s": 0.0}}}},
     "readers.lmdb.raw_sequential.MB_per_s must be a number > 0 (MB per second), not 0.0"),
    ({"dataset": "d", "batch": 8, "readers": {"hdf5": {"raw_sequential": {"MB_per_s": -3}}}},
     "readers.hdf5.raw_sequential.MB_per_s must be a number > 0"),
])
def test_a_bad_bench_io_record_is_refused_and_nothing_is_written(tmp_path, capsys, record, says):
    from firescale.cli import main

    bench = tmp_path / "bench-io.json"
    bench.write_text(json.dumps(record))
    out = tmp_path / "calibration.json"
    assert main(["predict", "calibrate", "--site", "local", "--net", "alexnet", "--batch", "64", "--iteration-s", "100",
                 "--io-record", str(bench), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"firescale: error: {bench}: ") and says in err and err.count("\n") == 1
    assert not out.exists()


def test_a_pytorch_experiments_points_wait_for_no_horovod_cycle(tmp_path, local_site, digits_config):
    """A site's Horovod cycle paces a TensorFlow experiment's multi-rank points (model/cycle.py); the same
    experiment trained by the pytorch backend sums over torch.distributed, which waits for no cycle: its
    points are the work alone.  The 1-GPU baseline has no allreduce, and is the same either way."""
    from firescale.cluster.site import load_site
    from firescale.model.paleo import platform_from_site
    from firescale.sweep.plan import load_plan

    site = yaml.safe_load(local_site.read_text())
    site["horovod"] = {"cycle_time_ms": 50}      # far above LeNet's few ms on digits
    path = tmp_path / "local" / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(site))
    config = yaml.safe_load(digits_config.read_text())
    predicted = {}
    for framework in ("tensorflow", "pytorch"):
        config["experiments"]["digits-lenet"]["framework"] = framework
        config_path = tmp_path / f"{framework}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        predicted[framework] = predict_experiment_points(load_plan(path, config_path))
    tf, torch = predicted["tensorflow"], predicted["pytorch"]
    assert platform_from_site(load_site(path)).cycle_s == 0.05
    assert tf["baseline"]["iteration_s"] == torch["baseline"]["iteration_s"] < 0.05
    two = next(name for name, p in tf.items() if p["gpus"] == 2)
    assert tf[two]["iteration_s"] == pytest.approx(0.05)          # one iteration a cycle
    assert torch[two]["iteration_s"] < 0.01                        # its work alone: compute and allreduce
    assert torch[two]["comm_s"] == tf[two]["comm_s"] > 0


def predict_experiment_points(plan) -> dict:
    from firescale.predict.experiment import predict_experiment

    return predict_experiment(plan, "digits-lenet")["points"]


def test_a_pytorch_experiment_is_priced_on_the_process_group_its_ranks_take(repo, tmp_path, local_site,
                                                                           digits_config):
    """The ranks of a CPU site whose launcher starts MPI take the MPI group (auto), whose MPI_Allreduce runs the
    site's allreduce (local: mpirun, a binomial tree; vcluster: srun --mpi=pmix, the same); srun without an MPI
    plugin leaves them Gloo, priced as Gloo's ring whatever the site asks of MPI.  A TensorFlow experiment names
    no process group."""
    from firescale.cluster.site import load_site
    from firescale.model.comm import allreduce_time
    from firescale.model.paleo import platform_from_site, site_process_group
    from firescale.predict.experiment import predict_experiment
    from firescale.sweep.plan import load_plan

    config = yaml.safe_load(digits_config.read_text())
    config["experiments"]["digits-lenet"]["framework"] = "pytorch"
    config_path = tmp_path / "pytorch.yaml"
    config_path.write_text(yaml.safe_dump(config))
    site = yaml.safe_load((repo / "site" / "vcluster" / "site.yaml").read_text())
    site.update(srun_mpi="none", paths=yaml.safe_load(local_site.read_text())["paths"])
    path = tmp_path / "vcluster" / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(site))
    assert site_process_group(load_site(local_site)) == site_process_group(load_site("vcluster")) == "mpi"
    assert site_process_group(load_site(path)) == "gloo" and site_process_group(load_site("titan")) == "nccl"
    results = {group: predict_experiment(load_plan(where, config_path), "digits-lenet")
               for group, where in (("mpi", local_site), ("gloo", path))}
    two = {}
    for group, model in (("mpi", "tree"), ("gloo", "ring")):
        result = results[group]
        assert result["process_group"] == group and result["model"]["platform"]["algorithm"] == model
        two[group] = next(p for p in result["points"].values() if p["gpus"] == 2)
        assert two[group]["allreduce_model"] == model
    from firescale.model.layers import net_cost
    from firescale.nets.zoo import get_net

    nbytes = net_cost(get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)), 1).weight_bytes
    link = platform_from_site(load_site(local_site)).link
    assert two["mpi"]["comm_s"] == pytest.approx(allreduce_time("tree", nbytes, 2, link))
    # the experiment's own choice: Gloo on a site where auto would take MPI, priced as Gloo's ring, in the runs'
    # command, and in the calibration's probe (which reads the baseline's command)
    config["experiments"]["digits-lenet"]["process_group"] = "gloo"
    config_path.write_text(yaml.safe_dump(config))
    chosen = load_plan(local_site, config_path)
    result = predict_experiment(chosen, "digits-lenet")
    assert result["process_group"] == "gloo" and result["model"]["platform"]["algorithm"] == "ring"
    from firescale.sweep.jobs import train_command

    argv = train_command(chosen, "digits-lenet", chosen.baselines("digits-lenet")[0])
    assert argv[argv.index("--process-group") + 1] == "gloo"
    config["experiments"]["digits-lenet"]["framework"] = "tensorflow"
    config_path.write_text(yaml.safe_dump(config))
    with pytest.raises(FirescaleError, match="process_group gloo picks the pytorch backend's process group"):
        load_plan(local_site, config_path)
    del config["experiments"]["digits-lenet"]["process_group"]
    config_path.write_text(yaml.safe_dump(config))
    assert predict_experiment(load_plan(local_site, config_path), "digits-lenet")["process_group"] is None
